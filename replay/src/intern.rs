//! intern gives each distinct key a dense `u32` id, storing its bytes once in one arena.

use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};

/// Interner maps key bytes to ids `0, 1, 2, …` in order of first appearance.
#[derive(Default)]
pub struct Interner {
    table: HashTable<u32>,
    hasher: DefaultHashBuilder,
    /// All keys back to back.
    bytes: Vec<u8>,
    /// `ends[id]` is where key `id` ends in `bytes`.
    ends: Vec<usize>,
}

impl Interner {
    /// The id of `key`, adding it when new.
    #[inline]
    pub fn intern(&mut self, key: &[u8]) -> u32 {
        let hash = self.hasher.hash_one(key);
        let (bytes, ends) = (&self.bytes, &self.ends);
        let get = |id: u32| -> &[u8] {
            let i = id as usize;
            let start = if i == 0 { 0 } else { ends[i - 1] };
            &bytes[start..ends[i]]
        };
        if let Some(&id) = self.table.find(hash, |&id| get(id) == key) {
            return id;
        }
        let id = u32::try_from(self.ends.len()).expect("more than 2^32 distinct keys");
        self.bytes.extend_from_slice(key);
        self.ends.push(self.bytes.len());
        let (bytes, ends, hasher) = (&self.bytes, &self.ends, &self.hasher);
        self.table.insert_unique(hash, id, |&other| {
            let i = other as usize;
            let start = if i == 0 { 0 } else { ends[i - 1] };
            hasher.hash_one(&bytes[start..ends[i]])
        });
        id
    }

    /// The bytes of key `id`.
    pub fn get(&self, id: u32) -> &[u8] {
        let i = id as usize;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    /// How many distinct keys.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether no key was seen.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes held (arena, ends and table), for the memory report.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.ends.capacity() * 8 + self.table.capacity() * 5
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dense_and_stable() {
        let mut i = Interner::default();
        assert_eq!(i.intern(b"10.0.0.1"), 0);
        assert_eq!(i.intern(b"::1"), 1);
        assert_eq!(i.intern(b""), 2);
        assert_eq!(i.intern(b"10.0.0.1"), 0);
        assert_eq!(i.intern(b""), 2);
        assert_eq!(i.get(1), b"::1");
        assert_eq!(i.get(2), b"");
        assert_eq!(i.len(), 3);
        for n in 0..10_000u32 {
            assert_eq!(i.intern(format!("k{n}").as_bytes()), n + 3);
        }
        for n in (0..10_000u32).rev() {
            assert_eq!(i.intern(format!("k{n}").as_bytes()), n + 3);
            assert_eq!(i.get(n + 3), format!("k{n}").as_bytes());
        }
    }
}
