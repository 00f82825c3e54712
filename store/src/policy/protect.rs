//! What eviction for a write must leave alone.

/// What eviction for a write must respect: the keys it must not choose
/// (the key being written and, under `prefix`, the block it continues: a
/// chain written under pressure keeps its last block; a block stored cold
/// goes to the front, where the next block's write would meet it first),
/// and whose write it is (its tenant: eviction for it takes from tenants
/// above their share, else from it).
#[derive(Clone, Copy, Debug)]
pub struct Protect<'a> {
    key: Option<&'a [u8]>,
    parent: Option<&'a [u8]>,
    /// The writer's tenant slot (None: no tenant's write, as a budget
    /// lowered by CONFIG SET).
    pub(crate) tenant: Option<u8>,
}

impl<'a> Protect<'a> {
    /// Nothing protected.
    pub const NONE: Protect<'static> = Protect {
        key: None,
        parent: None,
        tenant: None,
    };

    /// `key` alone.
    pub fn key(key: &'a [u8]) -> Protect<'a> {
        Protect {
            key: Some(key),
            parent: None,
            tenant: None,
        }
    }

    /// `key` and, if given, `parent`, for a write of tenant slot `tenant`.
    pub(crate) fn write(key: &'a [u8], parent: Option<&'a [u8]>, tenant: u8) -> Protect<'a> {
        Protect {
            key: Some(key),
            parent,
            tenant: Some(tenant),
        }
    }

    /// The same, for a write of tenant slot `tenant`.
    pub(crate) fn by(self, tenant: u8) -> Protect<'a> {
        Protect {
            tenant: Some(tenant),
            ..self
        }
    }

    /// Whether `key` must not be chosen.
    pub(crate) fn covers(&self, key: &[u8]) -> bool {
        self.key == Some(key) || self.parent == Some(key)
    }
}
