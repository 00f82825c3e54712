//! Slot → shard: each of a node's shards owns a contiguous range of the
//! 16384 hash slots, so a SCAN walks one shard's slots before moving to the
//! next. The slot function and the split (Redis Cluster's CRC16 of the hash
//! tag; contiguous ranges per shard) are the store's, [`kvtier_store::slot`],
//! re-exported here.

pub use kvtier_store::slot::{crc16, hashtag, key_slot, shard_slots, slot_shard, SLOTS};
