//! The names of a shard.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One shard of one collection, by the collection's numeric id: the catalog's
/// key and the wire's (`quiver.v1.meta.ShardRef`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ShardKey {
    /// The collection's id (not its name).
    pub collection_id: u64,
    /// Shard number, `0..shards`.
    pub shard: u32,
}

impl fmt::Display for ShardKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}/{}", self.collection_id, self.shard)
    }
}

/// One shard of one collection, by the collection's id as text: the name the
/// object layout and the data roles use (`collections/{collection_id}/shards/…`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ShardRef {
    /// The collection's id (not its name: a dropped and re-created collection
    /// gets a new id, so its objects never mix with the old ones).
    pub collection_id: String,
    /// Shard number, `0..shards`.
    pub shard: u32,
}

impl fmt::Display for ShardRef {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}/{}", self.collection_id, self.shard)
    }
}

impl From<ShardKey> for ShardRef {
    fn from(key: ShardKey) -> Self {
        ShardRef {
            collection_id: key.collection_id.to_string(),
            shard: key.shard,
        }
    }
}

impl ShardRef {
    /// Returns the catalog key of this shard, or a message when the collection
    /// id is not a number (only catalogs of tests use other ids).
    pub fn key(&self) -> Result<ShardKey, String> {
        let collection_id = self
            .collection_id
            .parse()
            .map_err(|_| format!("collection id `{}` is not a number", self.collection_id))?;
        Ok(ShardKey {
            collection_id,
            shard: self.shard,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_names_print_alike_and_convert() {
        let key = ShardKey {
            collection_id: 7,
            shard: 2,
        };
        let shard = ShardRef::from(key);
        assert_eq!(shard.to_string(), key.to_string());
        assert_eq!(shard.key(), Ok(key));
        let test_shard = ShardRef {
            collection_id: "c-test".into(),
            shard: 0,
        };
        assert!(test_shard.key().unwrap_err().contains("c-test"));
    }
}
