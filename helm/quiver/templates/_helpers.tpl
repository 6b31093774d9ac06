{{/*
Names, labels and the pieces every role's pod shares. Ports are the convention of
docs/operations.md and are not configurable: gRPC 7100/7200/7300 and HTTP
(/metrics /healthz /readyz) 7101/7201/7301 for meta/indexer/searcher; the gateway
serves REST + HTTP endpoints on 7700 and gRPC on 7701.
*/}}

{{- define "quiver.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name prefix; role suffixes (-indexer is the longest) must still fit 63 characters. */}}
{{- define "quiver.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "quiver.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every resource; call with (dict "root" $ "component" "meta"). */}}
{{- define "quiver.labels" -}}
helm.sh/chart: {{ include "quiver.chart" .root }}
{{ include "quiver.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: quiver
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "quiver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "quiver.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end }}

{{- define "quiver.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "quiver.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "quiver.image" -}}
{{- $image := .Values.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* Image of the `helm test` Pod (tests.image). */}}
{{- define "quiver.testImage" -}}
{{- $image := .Values.tests.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository $image.tag }}
{{- end }}
{{- end }}

{{/* Headless Service of the meta StatefulSet; it gives every meta pod a stable DNS name. */}}
{{- define "quiver.metaService" -}}
{{- printf "%s-meta" (include "quiver.fullname" .) }}
{{- end }}

{{/* Stable gRPC address of meta pod $ordinal: (list $ $ordinal). */}}
{{- define "quiver.metaAddress" -}}
{{- $root := index . 0 }}
{{- $ordinal := index . 1 }}
{{- printf "%s-%d.%s.%s.svc.%s:7100" (include "quiver.metaService" $root) (int $ordinal) (include "quiver.metaService" $root) $root.Release.Namespace $root.Values.clusterDomain }}
{{- end }}

{{/* `--meta` of the data roles: every meta pod's stable address, comma-separated. */}}
{{- define "quiver.metaAddresses" -}}
{{- $addresses := list }}
{{- range $ordinal := until (int .Values.meta.replicas) }}
{{- $addresses = append $addresses (include "quiver.metaAddress" (list $ $ordinal)) }}
{{- end }}
{{- join "," $addresses }}
{{- end }}

{{/* `--peers` of meta: node id (ordinal + 1) = stable address of the first n pods: (list $ n). */}}
{{- define "quiver.metaPeers" -}}
{{- $root := index . 0 }}
{{- $peers := list }}
{{- range $ordinal := until (int (index . 1)) }}
{{- $peers = append $peers (printf "%d=%s" (add1 $ordinal) (include "quiver.metaAddress" (list $root $ordinal))) }}
{{- end }}
{{- join "," $peers }}
{{- end }}

{{- define "quiver.objectStoreUrl" -}}
{{- $store := .Values.objectStore }}
{{- if $store.prefix }}
{{- printf "s3://%s/%s" $store.bucket (trimAll "/" $store.prefix) }}
{{- else }}
{{- printf "s3://%s" $store.bucket }}
{{- end }}
{{- end }}

{{/* Environment of the roles that read or write the object store. */}}
{{- define "quiver.objectStoreEnv" -}}
{{- $store := .Values.objectStore -}}
- name: AWS_REGION
  value: {{ $store.region | quote }}
{{- if $store.endpoint }}
- name: AWS_ENDPOINT_URL
  value: {{ $store.endpoint | quote }}
{{- end }}
{{- if $store.virtualHostedStyle }}
- name: AWS_VIRTUAL_HOSTED_STYLE_REQUEST
  value: "true"
{{- end }}
{{- with $store.credentials.existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $store.credentials.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $store.credentials.secretAccessKeyKey }}
- name: AWS_SESSION_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $store.credentials.sessionTokenKey }}
      optional: true
{{- end }}
{{- end }}

{{/* Environment of every role: pod identity from the downward API and logging. */}}
{{- define "quiver.commonEnv" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: RUST_LOG
  value: {{ .Values.logLevel | quote }}
{{- end }}

{{/* Flags every role takes, space-separated: (list $ "meta"). */}}
{{- define "quiver.commonFlags" -}}
{{- $root := index . 0 }}
{{- $role := index . 1 }}
{{- $flags := list "--log-format" $root.Values.logFormat "--shutdown-grace-ms" (printf "%d" (int64 $root.Values.shutdownGraceMs)) }}
{{- if (index $root.Values $role).config }}
{{- $flags = concat $flags (list "--config" "/etc/quiver/config.toml") }}
{{- end }}
{{- if $root.Values.clusterTls.enabled }}
{{- $directory := "/etc/quiver/cluster-tls" }}
{{- $flags = concat $flags (list "--cluster-tls-ca" (printf "%s/ca.crt" $directory) "--cluster-tls-cert" (printf "%s/tls.crt" $directory) "--cluster-tls-key" (printf "%s/tls.key" $directory)) }}
{{- end }}
{{- join " " $flags }}
{{- end }}

{{/* Secret of a role's certificate for TLS between roles: (list $ "meta"). */}}
{{- define "quiver.clusterTlsSecretName" -}}
{{- $root := index . 0 }}
{{- $role := index . 1 }}
{{- default $root.Values.clusterTls.secretName (index $root.Values.clusterTls.roleSecretNames $role) }}
{{- end }}

{{/* The cluster TLS Secret as a volume, when TLS between roles is on: (list $ "meta"). */}}
{{- define "quiver.clusterTlsVolume" -}}
{{- $root := index . 0 }}
{{- if $root.Values.clusterTls.enabled }}
- name: cluster-tls
  secret:
    secretName: {{ include "quiver.clusterTlsSecretName" . }}
{{- end }}
{{- end }}

{{- define "quiver.clusterTlsVolumeMount" -}}
{{- $root := index . 0 }}
{{- if $root.Values.clusterTls.enabled }}
- name: cluster-tls
  mountPath: /etc/quiver/cluster-tls
  readOnly: true
{{- end }}
{{- end }}

{{/* The same flags as container args (YAML list items). */}}
{{- define "quiver.commonArgs" -}}
{{- splitList " " (include "quiver.commonFlags" .) | toYaml }}
{{- end }}

{{- define "quiver.terminationGracePeriodSeconds" -}}
{{- add (div (int64 .Values.shutdownGraceMs) 1000) 15 }}
{{- end }}

{{/* Pod-level settings shared by all roles: (list $ "meta"). */}}
{{- define "quiver.podSpecCommon" -}}
{{- $root := index . 0 }}
{{- $role := index . 1 }}
{{- $values := index $root.Values $role -}}
serviceAccountName: {{ include "quiver.serviceAccountName" $root }}
automountServiceAccountToken: {{ $root.Values.serviceAccount.automountServiceAccountToken }}
terminationGracePeriodSeconds: {{ include "quiver.terminationGracePeriodSeconds" $root }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $values.affinity }}
affinity:
  {{- toYaml $values.affinity | nindent 2 }}
{{- else if eq $values.podAntiAffinity "soft" }}
affinity:
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "quiver.selectorLabels" (dict "root" $root "component" $role) | nindent 14 }}
{{- else if eq $values.podAntiAffinity "hard" }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "quiver.selectorLabels" (dict "root" $root "component" $role) | nindent 12 }}
{{- end }}
{{- with $values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- range . }}
  {{- $constraint := deepCopy . }}
  {{- if not (hasKey $constraint "labelSelector") }}
  {{- $_ := set $constraint "labelSelector" (dict "matchLabels" (include "quiver.selectorLabels" (dict "root" $root "component" $role) | fromYaml)) }}
  {{- end }}
  - {{- toYaml $constraint | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}

{{/* Pod template metadata: (list $ "meta"). Config changes roll the pods. */}}
{{- define "quiver.podMetadata" -}}
{{- $root := index . 0 }}
{{- $role := index . 1 }}
{{- $values := index $root.Values $role -}}
labels:
  {{- include "quiver.labels" (dict "root" $root "component" $role) | nindent 2 }}
  {{- with $values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  checksum/config: {{ $values.config | toJson | sha256sum }}
  {{- with $values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* The role's config file as a ConfigMap volume, when it has settings: (list $ "meta"). */}}
{{- define "quiver.configVolume" -}}
{{- $root := index . 0 }}
{{- $role := index . 1 }}
{{- if (index $root.Values $role).config }}
- name: config
  configMap:
    name: {{ include "quiver.fullname" $root }}-{{ $role }}-config
{{- end }}
{{- end }}

{{- define "quiver.configVolumeMount" -}}
{{- $root := index . 0 }}
{{- $role := index . 1 }}
{{- if (index $root.Values $role).config }}
- name: config
  mountPath: /etc/quiver
  readOnly: true
{{- end }}
{{- end }}

{{/* Probes on the role's HTTP port; the searcher's /readyz turns 200 only once its shards are warm. */}}
{{- define "quiver.probes" -}}
{{- $port := index . 0 }}
{{- $scheme := index . 1 -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ $port }}
    scheme: {{ $scheme }}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 6
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ $port }}
    scheme: {{ $scheme }}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
{{- end }}

{{/* Bytes of a size written as <n>MiB|GiB|TiB. */}}
{{- define "quiver.sizeBytes" -}}
{{- $number := regexReplaceAll "^([0-9]+)(MiB|GiB|TiB)$" . "${1}" | int64 }}
{{- $unit := regexReplaceAll "^[0-9]+" . "" }}
{{- $scale := dict "MiB" 1048576 "GiB" 1073741824 "TiB" 1099511627776 }}
{{- mul $number (index $scale $unit) }}
{{- end }}

{{/* Size of the searcher's cache volume in bytes: cache file + headroom. */}}
{{- define "quiver.cacheVolumeBytes" -}}
{{- add (include "quiver.sizeBytes" .Values.searcher.cache.size | int64) (include "quiver.sizeBytes" .Values.searcher.cache.headroom | int64) }}
{{- end }}

{{- define "quiver.apiKeysSecretName" -}}
{{- default (printf "%s-api-keys" (include "quiver.fullname" .)) .Values.gateway.auth.existingSecret }}
{{- end }}

{{- define "quiver.tlsSecretName" -}}
{{- default (printf "%s-gateway-tls" (include "quiver.fullname" .)) .Values.gateway.tls.secretName }}
{{- end }}

{{- define "quiver.gatewayScheme" -}}
{{- if .Values.gateway.tls.enabled }}HTTPS{{ else }}HTTP{{ end }}
{{- end }}

{{/* Checks across values that the JSON schema cannot express. */}}
{{- define "quiver.validate" -}}
{{- if gt (int .Values.meta.bootstrapVoters) (int .Values.meta.replicas) }}
{{- fail (printf "meta.bootstrapVoters (%d) cannot exceed meta.replicas (%d)" (int .Values.meta.bootstrapVoters) (int .Values.meta.replicas)) }}
{{- end }}
{{- if and .Values.gateway.tls.enabled (not .Values.gateway.tls.secretName) (not (and .Values.gateway.tls.certificate .Values.gateway.tls.privateKey)) }}
{{- fail "gateway.tls.enabled needs gateway.tls.secretName or both gateway.tls.certificate and gateway.tls.privateKey" }}
{{- end }}
{{- if .Values.clusterTls.enabled }}
{{- range $role := list "meta" "indexer" "searcher" "gateway" }}
{{- if not (include "quiver.clusterTlsSecretName" (list $ $role)) }}
{{- fail (printf "clusterTls.enabled needs clusterTls.secretName or clusterTls.roleSecretNames.%s (a kubernetes.io/tls Secret with ca.crt)" $role) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.searcher.autoscaling.enabled (gt (int .Values.searcher.autoscaling.minReplicas) (int .Values.searcher.autoscaling.maxReplicas)) }}
{{- fail "searcher.autoscaling.minReplicas cannot exceed searcher.autoscaling.maxReplicas" }}
{{- end }}
{{- if and (eq .Values.searcher.cache.medium "Memory") (eq .Values.searcher.cache.volumeType "ephemeral") }}
{{- fail "searcher.cache.medium Memory only applies to volumeType emptyDir" }}
{{- end }}
{{- end }}
