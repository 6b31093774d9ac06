//! WAL objects and deletion bitmaps: the two small binary objects the write path
//! puts in object storage next to segments.
//!
//! A WAL object is one group commit of one shard: every upsert and delete that
//! arrived in one commit window, in arrival order. Layout (little-endian):
//!
//! ```text
//! magic "QVRWAL\0\x01" | version u32 | shard u32 | epoch u64 | sequence u64
//! | dimension u32 | record count u32 | records… | crc32c u32 (of all bytes before)
//! record: tag u8 (1 upsert, 2 delete) | id | [vector f32 × dimension
//!         | payload length u32 | payload bytes (JSON)]   (upsert only)
//! id:     kind u8 (0 u64, 1 string) | u64 | or length u16 + UTF-8 bytes
//! ```
//!
//! A deletion bitmap is the set of deleted rows of one segment at one version:
//! `magic "QVRDEL\0\x01" | version u32 | rows u32 | roaring bitmap | crc32c u32`.
//! Both decoders check magic, version, lengths and checksum, and name the object
//! in every error: a damaged object is an error, never wrong data.

use bytes::{BufMut, Bytes, BytesMut};
use quiver_model::PointId;
use roaring::RoaringBitmap;

use crate::error::{StorageError, StorageResult};

const WAL_MAGIC: &[u8; 8] = b"QVRWAL\0\x01";
const DELETES_MAGIC: &[u8; 8] = b"QVRDEL\0\x01";
/// Format version of WAL objects this build writes and reads.
pub const WAL_FORMAT_VERSION: u32 = 1;
/// Format version of deletion bitmaps this build writes and reads.
pub const DELETES_FORMAT_VERSION: u32 = 1;

const TAG_UPSERT: u8 = 1;
const TAG_DELETE: u8 = 2;
const ID_U64: u8 = 0;
const ID_STRING: u8 = 1;
const WAL_HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 8 + 4 + 4;

/// One write in a WAL object.
#[derive(Clone, Debug, PartialEq)]
pub enum WalRecord {
    /// Insert or replace the point `id`.
    Upsert {
        /// Point id.
        id: PointId,
        /// The vector, `dimension` values.
        vector: Vec<f32>,
        /// The payload as JSON bytes; empty for none.
        payload: Vec<u8>,
    },
    /// Remove the point `id` (a no-op if it does not exist).
    Delete {
        /// Point id.
        id: PointId,
    },
}

impl WalRecord {
    /// Returns the record's point id.
    pub fn id(&self) -> &PointId {
        match self {
            WalRecord::Upsert { id, .. } | WalRecord::Delete { id } => id,
        }
    }

    fn encoded_bytes(&self, dimension: usize) -> usize {
        let id_bytes = match self.id() {
            PointId::U64(_) => 1 + 8,
            PointId::String(id) => 1 + 2 + id.len(),
        };
        match self {
            WalRecord::Upsert { payload, .. } => 1 + id_bytes + dimension * 4 + 4 + payload.len(),
            WalRecord::Delete { .. } => 1 + id_bytes,
        }
    }
}

/// One group commit of one shard: the content of one WAL object.
#[derive(Clone, Debug, PartialEq)]
pub struct WalBatch {
    /// Shard the writes belong to.
    pub shard: u32,
    /// Lease epoch of the indexer that wrote it.
    pub epoch: u64,
    /// Sequence number of this batch within the shard (increasing).
    pub sequence: u64,
    /// Vector dimension of every upsert.
    pub dimension: u32,
    /// The writes, in arrival order.
    pub records: Vec<WalRecord>,
}

impl WalBatch {
    /// Returns the batch encoded as a WAL object.
    ///
    /// Panics if an upsert's vector does not have `dimension` values or a string
    /// id is longer than `u16::MAX` bytes: callers validate writes first.
    pub fn encode(&self) -> Bytes {
        let dimension = self.dimension as usize;
        let body: usize = self
            .records
            .iter()
            .map(|record| record.encoded_bytes(dimension))
            .sum();
        let mut out = BytesMut::with_capacity(WAL_HEADER_BYTES + body + 4);
        out.put_slice(WAL_MAGIC);
        out.put_u32_le(WAL_FORMAT_VERSION);
        out.put_u32_le(self.shard);
        out.put_u64_le(self.epoch);
        out.put_u64_le(self.sequence);
        out.put_u32_le(self.dimension);
        out.put_u32_le(self.records.len() as u32);
        for record in &self.records {
            match record {
                WalRecord::Upsert {
                    id,
                    vector,
                    payload,
                } => {
                    assert_eq!(vector.len(), dimension, "vector of the wrong dimension");
                    out.put_u8(TAG_UPSERT);
                    put_id(&mut out, id);
                    for value in vector {
                        out.put_f32_le(*value);
                    }
                    out.put_u32_le(payload.len() as u32);
                    out.put_slice(payload);
                }
                WalRecord::Delete { id } => {
                    out.put_u8(TAG_DELETE);
                    put_id(&mut out, id);
                }
            }
        }
        let checksum = crc32c::crc32c(&out);
        out.put_u32_le(checksum);
        out.freeze()
    }

    /// Decodes the WAL object `key`, checking its checksum and every length.
    pub fn decode(key: &str, bytes: &[u8]) -> StorageResult<WalBatch> {
        let corrupted = |reason: String| StorageError::Corrupted {
            key: key.to_string(),
            reason,
        };
        let body =
            checked_body(bytes, WAL_MAGIC, WAL_HEADER_BYTES, "WAL object").map_err(corrupted)?;
        let mut reader = Reader {
            bytes: &body[8..],
            key,
        };
        let version = reader.u32()?;
        if version != WAL_FORMAT_VERSION {
            return Err(corrupted(format!(
                "WAL format version {version}, this build reads {WAL_FORMAT_VERSION}"
            )));
        }
        let shard = reader.u32()?;
        let epoch = reader.u64()?;
        let sequence = reader.u64()?;
        let dimension = reader.u32()?;
        let count = reader.u32()? as usize;
        // Every record takes at least 2 bytes, so a count beyond that is damage,
        // not a reason to allocate.
        if count > reader.bytes.len() / 2 {
            return Err(corrupted(format!(
                "record count {count} does not fit in {} bytes",
                reader.bytes.len()
            )));
        }
        let mut records = Vec::with_capacity(count);
        for index in 0..count {
            let record = match reader.u8()? {
                TAG_UPSERT => {
                    let id = reader.id()?;
                    let values = reader.take(dimension as usize * 4)?;
                    let vector = values
                        .chunks_exact(4)
                        .map(|chunk| f32::from_le_bytes(chunk.try_into().expect("4 bytes")))
                        .collect();
                    let payload_bytes = reader.u32()? as usize;
                    let payload = reader.take(payload_bytes)?.to_vec();
                    WalRecord::Upsert {
                        id,
                        vector,
                        payload,
                    }
                }
                TAG_DELETE => WalRecord::Delete { id: reader.id()? },
                tag => {
                    return Err(corrupted(format!("record {index} has unknown tag {tag}")));
                }
            };
            records.push(record);
        }
        if !reader.bytes.is_empty() {
            return Err(corrupted(format!(
                "{} bytes after the last record",
                reader.bytes.len()
            )));
        }
        Ok(WalBatch {
            shard,
            epoch,
            sequence,
            dimension,
            records,
        })
    }
}

fn put_id(out: &mut BytesMut, id: &PointId) {
    match id {
        PointId::U64(id) => {
            out.put_u8(ID_U64);
            out.put_u64_le(*id);
        }
        PointId::String(id) => {
            let length = u16::try_from(id.len()).expect("string ids are validated short");
            out.put_u8(ID_STRING);
            out.put_u16_le(length);
            out.put_slice(id.as_bytes());
        }
    }
}

/// Checks magic and checksum; returns the bytes before the checksum.
fn checked_body<'b>(
    bytes: &'b [u8],
    magic: &[u8; 8],
    minimum: usize,
    what: &str,
) -> Result<&'b [u8], String> {
    if bytes.len() < minimum + 4 {
        return Err(format!("{what} is only {} bytes", bytes.len()));
    }
    if &bytes[..8] != magic {
        return Err(format!("not a {what} (bad magic)"));
    }
    let (body, stored) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes(stored.try_into().expect("4 bytes"));
    let computed = crc32c::crc32c(body);
    if stored != computed {
        return Err(format!(
            "checksum mismatch (stored {stored:08x}, computed {computed:08x})"
        ));
    }
    Ok(body)
}

/// A bounds-checked little-endian reader whose errors name the object.
struct Reader<'b> {
    bytes: &'b [u8],
    key: &'b str,
}

impl<'b> Reader<'b> {
    fn take(&mut self, length: usize) -> StorageResult<&'b [u8]> {
        if length > self.bytes.len() {
            return Err(StorageError::Corrupted {
                key: self.key.to_string(),
                reason: format!("needs {length} more bytes, {} are left", self.bytes.len()),
            });
        }
        let (head, rest) = self.bytes.split_at(length);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self) -> StorageResult<u8> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> StorageResult<u16> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2")))
    }

    fn u32(&mut self) -> StorageResult<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }

    fn u64(&mut self) -> StorageResult<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }

    fn id(&mut self) -> StorageResult<PointId> {
        match self.u8()? {
            ID_U64 => Ok(PointId::U64(self.u64()?)),
            ID_STRING => {
                let length = self.u16()? as usize;
                let bytes = self.take(length)?;
                let id = std::str::from_utf8(bytes).map_err(|_| StorageError::Corrupted {
                    key: self.key.to_string(),
                    reason: "a string id is not UTF-8".into(),
                })?;
                Ok(PointId::String(id.to_string()))
            }
            kind => Err(StorageError::Corrupted {
                key: self.key.to_string(),
                reason: format!("unknown id kind {kind}"),
            }),
        }
    }
}

/// The deleted rows of one segment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeletionBitmap {
    /// Rows of the segment (deleted rows are all below it).
    pub segment_rows: u32,
    /// Deleted rows.
    pub deleted: RoaringBitmap,
}

impl DeletionBitmap {
    /// Returns the bitmap encoded as a deletion-bitmap object.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(8 + 4 + 4 + self.deleted.serialized_size() + 4);
        out.put_slice(DELETES_MAGIC);
        out.put_u32_le(DELETES_FORMAT_VERSION);
        out.put_u32_le(self.segment_rows);
        let mut writer = out.writer();
        self.deleted
            .serialize_into(&mut writer)
            .expect("writing into memory cannot fail");
        let mut out = writer.into_inner();
        let checksum = crc32c::crc32c(&out);
        out.put_u32_le(checksum);
        out.freeze()
    }

    /// Decodes the deletion-bitmap object `key`.
    pub fn decode(key: &str, bytes: &[u8]) -> StorageResult<DeletionBitmap> {
        let corrupted = |reason: String| StorageError::Corrupted {
            key: key.to_string(),
            reason,
        };
        let body = checked_body(bytes, DELETES_MAGIC, 16, "deletion bitmap").map_err(corrupted)?;
        let version = u32::from_le_bytes(body[8..12].try_into().expect("4"));
        if version != DELETES_FORMAT_VERSION {
            return Err(corrupted(format!(
                "deletion bitmap format version {version}, this build reads {DELETES_FORMAT_VERSION}"
            )));
        }
        let segment_rows = u32::from_le_bytes(body[12..16].try_into().expect("4"));
        let deleted = RoaringBitmap::deserialize_from(&body[16..])
            .map_err(|error| corrupted(format!("bitmap does not decode: {error}")))?;
        if deleted.max().is_some_and(|row| row >= segment_rows) {
            return Err(corrupted(format!(
                "deleted row {} is outside the segment's {segment_rows} rows",
                deleted.max().unwrap_or_default()
            )));
        }
        Ok(DeletionBitmap {
            segment_rows,
            deleted,
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn sample_batch() -> WalBatch {
        WalBatch {
            shard: 3,
            epoch: 7,
            sequence: 42,
            dimension: 4,
            records: vec![
                WalRecord::Upsert {
                    id: PointId::U64(1),
                    vector: vec![1.0, -2.0, 0.5, 3.25],
                    payload: br#"{"lang":"en"}"#.to_vec(),
                },
                WalRecord::Delete {
                    id: PointId::String("doc-9".into()),
                },
                WalRecord::Upsert {
                    id: PointId::String("é".into()),
                    vector: vec![0.0; 4],
                    payload: Vec::new(),
                },
            ],
        }
    }

    #[test]
    fn wal_batches_round_trip() {
        let batch = sample_batch();
        let bytes = batch.encode();
        assert_eq!(WalBatch::decode("k", &bytes).unwrap(), batch);
    }

    #[test]
    fn every_flipped_byte_and_every_cut_is_detected() {
        let bytes = sample_batch().encode().to_vec();
        for position in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[position] ^= 0x10;
            let error = WalBatch::decode("wal/key", &damaged).unwrap_err();
            assert!(error.to_string().contains("wal/key"), "{error}");
        }
        for length in 0..bytes.len() {
            assert!(WalBatch::decode("wal/key", &bytes[..length]).is_err());
        }
    }

    #[test]
    fn deletion_bitmaps_round_trip_and_reject_damage() {
        let bitmap = DeletionBitmap {
            segment_rows: 1000,
            deleted: [1u32, 5, 999].into_iter().collect(),
        };
        let bytes = bitmap.encode();
        assert_eq!(DeletionBitmap::decode("d", &bytes).unwrap(), bitmap);
        let mut damaged = bytes.to_vec();
        damaged[20] ^= 1;
        let error = DeletionBitmap::decode("deletes/x", &damaged).unwrap_err();
        assert!(error.to_string().contains("deletes/x"), "{error}");
        let outside = DeletionBitmap {
            segment_rows: 10,
            deleted: [10u32].into_iter().collect(),
        };
        let error = DeletionBitmap::decode("d", &outside.encode()).unwrap_err();
        assert!(error.to_string().contains("outside"), "{error}");
    }

    fn arbitrary_id() -> impl Strategy<Value = PointId> {
        prop_oneof![
            any::<u64>().prop_map(PointId::U64),
            "[a-z0-9é-]{0,40}".prop_map(PointId::String),
        ]
    }

    fn arbitrary_record(dimension: usize) -> impl Strategy<Value = WalRecord> {
        prop_oneof![
            (
                arbitrary_id(),
                prop::collection::vec(-1e6f32..1e6, dimension),
                prop::collection::vec(any::<u8>(), 0..64)
            )
                .prop_map(|(id, vector, payload)| WalRecord::Upsert {
                    id,
                    vector,
                    payload
                }),
            arbitrary_id().prop_map(|id| WalRecord::Delete { id }),
        ]
    }

    proptest! {
        #[test]
        fn arbitrary_batches_round_trip(
            (dimension, records) in (1usize..12).prop_flat_map(|dimension| {
                (Just(dimension), prop::collection::vec(arbitrary_record(dimension), 0..20))
            }),
            shard: u32, epoch: u64, sequence: u64,
        ) {
            let batch = WalBatch { shard, epoch, sequence, dimension: dimension as u32, records };
            prop_assert_eq!(WalBatch::decode("k", &batch.encode()).unwrap(), batch);
        }

        #[test]
        fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            let _ = WalBatch::decode("k", &bytes);
            let _ = DeletionBitmap::decode("k", &bytes);
        }
    }
}
