//! Compact forms of what the operator remembers per child: at 1,000 clusters it remembers
//! some 12,000 objects several times over (cache entries, apply records, the instance index),
//! and a heap block per name, version and uid was a third of its resident memory.
//!
//! Names, namespaces, resourceVersions and hash annotations are [`CompactString`]s — kept
//! inline up to 24 bytes, which every name devctl renders for a cluster of a usual name
//! length fits — and a uid the API server assigned (a UUID) is kept as its 16 bytes.

use std::collections::HashMap;
use std::fmt;

pub use compact_str::CompactString;

/// Values by namespace, then name. Each namespace is kept once, not per object, and a
/// lookup by `&str` builds no key.
#[derive(Debug)]
pub struct ByNamespace<V> {
    namespaces: HashMap<CompactString, HashMap<CompactString, V>>,
}

impl<V> Default for ByNamespace<V> {
    fn default() -> Self {
        Self {
            namespaces: HashMap::new(),
        }
    }
}

impl<V> ByNamespace<V> {
    pub fn get(&self, namespace: &str, name: &str) -> Option<&V> {
        self.namespaces.get(namespace)?.get(name)
    }

    pub fn get_mut(&mut self, namespace: &str, name: &str) -> Option<&mut V> {
        self.namespaces.get_mut(namespace)?.get_mut(name)
    }

    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        self.get(namespace, name).is_some()
    }

    /// The value at `namespace`/`name`, inserted by `default` if there is none.
    pub fn get_or_insert_with(
        &mut self,
        namespace: &str,
        name: &str,
        default: impl FnOnce() -> V,
    ) -> &mut V {
        self.names_mut(namespace)
            .entry(CompactString::from(name))
            .or_insert_with(default)
    }

    pub fn insert(&mut self, namespace: &str, name: &str, value: V) -> Option<V> {
        self.names_mut(namespace)
            .insert(CompactString::from(name), value)
    }

    /// Removes the value; a namespace left empty goes with it.
    pub fn remove(&mut self, namespace: &str, name: &str) -> Option<V> {
        let names = self.namespaces.get_mut(namespace)?;
        let removed = names.remove(name);
        if names.is_empty() {
            self.namespaces.remove(namespace);
        }
        removed
    }

    /// The names and values in `namespace`.
    pub fn in_namespace(&self, namespace: &str) -> impl Iterator<Item = (&str, &V)> {
        self.namespaces
            .get(namespace)
            .into_iter()
            .flatten()
            .map(|(name, value)| (name.as_str(), value))
    }

    /// Keeps what `keep(namespace, name, value)` says to keep.
    pub fn retain(&mut self, mut keep: impl FnMut(&str, &str, &mut V) -> bool) {
        self.namespaces.retain(|namespace, names| {
            names.retain(|name, value| keep(namespace, name, value));
            !names.is_empty()
        });
    }

    pub fn len(&self) -> usize {
        self.namespaces.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
    }

    fn names_mut(&mut self, namespace: &str) -> &mut HashMap<CompactString, V> {
        // A key of up to 24 bytes is built without a heap block.
        self.namespaces
            .entry(CompactString::from(namespace))
            .or_default()
    }
}

/// An object's uid: the 16 bytes of the UUID the API server assigns, or (for a uid not in the
/// canonical lower-case form, which the API does not require) its text.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Uid {
    Uuid([u8; 16]),
    Text(CompactString),
}

impl Uid {
    pub fn new(uid: &str) -> Self {
        parse_uuid(uid).map_or_else(|| Uid::Text(CompactString::from(uid)), Uid::Uuid)
    }

    /// Whether this is the uid `uid`.
    pub fn is(&self, uid: &str) -> bool {
        match self {
            Uid::Uuid(bytes) => parse_uuid(uid).as_ref() == Some(bytes),
            Uid::Text(text) => text == uid,
        }
    }
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Uid::Uuid(bytes) => {
                for (i, byte) in bytes.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
            Uid::Text(text) => f.write_str(text),
        }
    }
}

impl fmt::Debug for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Uid({self})")
    }
}

/// The bytes of a UUID in its canonical form (`8-4-4-4-12` lower-case hex digits): only that
/// form, so that [`Uid`]'s text is exactly the uid it was made from.
fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let text = text.as_bytes();
    if text.len() != 36 {
        return None;
    }
    let mut bytes = [0u8; 16];
    let mut digits = text
        .iter()
        .enumerate()
        .filter(|(i, _)| !matches!(i, 8 | 13 | 18 | 23));
    if [8, 13, 18, 23].iter().any(|&i| text[i] != b'-') {
        return None;
    }
    for byte in &mut bytes {
        let (_, high) = digits.next()?;
        let (_, low) = digits.next()?;
        *byte = (hex_digit(*high)? << 4) | hex_digit(*low)?;
    }
    Some(bytes)
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_is_kept_as_its_bytes_and_shown_as_it_came() {
        let text = "0f4e2b7c-91a3-4d5e-8f60-a1b2c3d4e5f6";
        let uid = Uid::new(text);
        assert!(matches!(uid, Uid::Uuid(_)));
        assert_eq!(uid.to_string(), text);
        assert!(uid.is(text));
        assert!(!uid.is("0f4e2b7c-91a3-4d5e-8f60-a1b2c3d4e5f7"));
        assert!(!uid.is("0F4E2B7C-91A3-4D5E-8F60-A1B2C3D4E5F6"));
    }

    #[test]
    fn other_uids_are_kept_as_text() {
        for text in [
            "0F4E2B7C-91A3-4D5E-8F60-A1B2C3D4E5F6",
            "u1",
            "0f4e2b7c+91a3-4d5e-8f60-a1b2c3d4e5f6",
            "",
        ] {
            let uid = Uid::new(text);
            assert!(matches!(uid, Uid::Text(_)), "{text}");
            assert_eq!(uid.to_string(), text);
            assert!(uid.is(text));
        }
        assert!(!Uid::new("u1").is("0f4e2b7c-91a3-4d5e-8f60-a1b2c3d4e5f6"));
    }

    #[test]
    fn by_namespace_drops_a_namespace_with_its_last_name() {
        let mut map = ByNamespace::default();
        map.insert("a", "x", 1);
        map.insert("a", "y", 2);
        map.insert("b", "x", 3);
        assert_eq!(map.len(), 3);
        assert_eq!(map.get("a", "y"), Some(&2));
        assert_eq!(map.remove("a", "x"), Some(1));
        assert_eq!(map.remove("a", "y"), Some(2));
        assert!(map.in_namespace("a").next().is_none());
        map.retain(|_, _, v| *v != 3);
        assert!(map.is_empty());
        *map.get_or_insert_with("c", "z", || 4) += 1;
        assert_eq!(map.get("c", "z"), Some(&5));
    }

    #[test]
    fn names_of_a_usual_length_need_no_heap_block() {
        assert!(!CompactString::from("orders-db-7-replication").is_heap_allocated());
        assert!(!CompactString::from("123456789").is_heap_allocated());
    }
}
