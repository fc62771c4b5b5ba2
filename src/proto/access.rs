//! Access keys: the random 128-bit capability that every registered region carries in its
//! `MemoryDesc` and every WRITE / READ chunk presents, checked by the target in constant time
//! before a byte is placed or sent.
//!
//! A key is 16 opaque bytes ([`ACCESS_KEY_BYTES`]), the same on the wire and in a packed
//! descriptor. All zeros ([`AccessKey::NONE`]) means "no key": a descriptor of MORI's format
//! (without the field), and a region registered local-only. The target grants nothing to
//! the zero key, whatever the region: a chunk presenting it is refused, and a local-only
//! region (whose key is zero) is never a remote target.
//!
//! Drawing keys needs the operating system's random source, so it happens outside this
//! module (`src/region.rs`); here keys are only carried and compared.

use subtle::ConstantTimeEq;

use super::limits::ACCESS_KEY_BYTES;

/// A region's access key (see the module documentation). Equality is constant-time, and
/// `Debug` never shows the bytes (descriptors and chunks get logged; keys must not be).
#[derive(Clone, Copy, Default)]
pub struct AccessKey([u8; ACCESS_KEY_BYTES]);

impl AccessKey {
    /// No key: granted nothing.
    pub const NONE: AccessKey = AccessKey([0; ACCESS_KEY_BYTES]);

    /// The key of these bytes (all zeros is [`Self::NONE`]).
    pub const fn from_bytes(b: [u8; ACCESS_KEY_BYTES]) -> Self {
        Self(b)
    }

    /// Its bytes, as they go on the wire and into a packed descriptor.
    pub const fn to_bytes(self) -> [u8; ACCESS_KEY_BYTES] {
        self.0
    }

    /// Its bytes, borrowed.
    pub fn as_bytes(&self) -> &[u8; ACCESS_KEY_BYTES] {
        &self.0
    }

    /// Whether this is [`Self::NONE`] (constant-time).
    pub fn is_none(&self) -> bool {
        bool::from(self.0[..].ct_eq(&[0u8; ACCESS_KEY_BYTES][..]))
    }

    /// Whether a chunk presenting `presented` may touch the region this key belongs to:
    /// the keys are equal and not [`Self::NONE`]. Constant-time in the bytes of both (one
    /// branch, on the combined verdict), so a peer learns nothing from how long a wrong key
    /// takes to refuse.
    pub fn grants(&self, presented: &AccessKey) -> bool {
        let same = self.0[..].ct_eq(&presented.0[..]);
        let none = self.0[..].ct_eq(&[0u8; ACCESS_KEY_BYTES][..]);
        bool::from(same & !none)
    }
}

impl PartialEq for AccessKey {
    /// Constant-time.
    fn eq(&self, other: &Self) -> bool {
        bool::from(self.0[..].ct_eq(&other.0[..]))
    }
}

impl Eq for AccessKey {}

impl std::fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_none() {
            f.write_str("AccessKey(none)")
        } else {
            f.write_str("AccessKey(<redacted>)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_nonzero_key_is_granted() {
        let k = AccessKey::from_bytes([7; ACCESS_KEY_BYTES]);
        let mut other = [7; ACCESS_KEY_BYTES];
        other[15] = 8;
        assert!(k.grants(&k));
        assert!(!k.grants(&AccessKey::from_bytes(other)));
        assert!(!k.grants(&AccessKey::NONE));
        assert!(
            !AccessKey::NONE.grants(&AccessKey::NONE),
            "no key grants nothing"
        );
        assert!(!AccessKey::NONE.grants(&k));
    }

    #[test]
    fn none_equality_bytes_and_debug() {
        assert!(AccessKey::NONE.is_none());
        assert!(AccessKey::default().is_none());
        let mut b = [0; ACCESS_KEY_BYTES];
        b[3] = 1;
        let k = AccessKey::from_bytes(b);
        assert!(!k.is_none());
        assert_eq!(k.to_bytes(), b);
        assert_eq!(k.as_bytes(), &b);
        assert_eq!(k, AccessKey::from_bytes(b));
        assert_ne!(k, AccessKey::NONE);
        assert_eq!(format!("{k:?}"), "AccessKey(<redacted>)");
        assert_eq!(format!("{:?}", AccessKey::NONE), "AccessKey(none)");
    }
}
