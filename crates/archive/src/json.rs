//! The JSON of an OCI image (`oci-layout`, `index.json`, manifests, configs), read so that this
//! tool and the runtimes agree on what it says.
//!
//! The runtimes and image tools (containerd, CRI-O, buildah, skopeo) decode it with Go's
//! `encoding/json`, which matches object keys to fields **case-insensitively** and lets the last of
//! two equal keys win; serde matches exactly. A manifest with `"layers"` and `"Layers"` would name one
//! layer to this tool and another to containerd. So, before any decoding, every object is checked:
//! no two keys that are equal when case is folded as Go folds it (exactly equal, in a free-form map),
//! and no key that folds to one of the
//! names the image format defines without being spelled exactly so (free-form maps, `annotations`
//! and `labels`, excepted from the second rule). Invalid UTF-8 (which Go replaces and serde refuses)
//! and trailing data are refused by serde itself.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// The keys of the image format's objects (OCI image spec 1.1, Docker's v2 schema 2), and schema 1's `fsLayers`,
/// which containerd looks for to refuse it.
const KNOWN_KEYS: &[&str] = &[
    "schemaVersion",
    "mediaType",
    "artifactType",
    "manifests",
    "layers",
    "config",
    "subject",
    "digest",
    "size",
    "urls",
    "data",
    "annotations",
    "platform",
    "imageLayoutVersion",
    "architecture",
    "os",
    "rootfs",
    "diff_ids",
    "type",
    "fsLayers",
];

/// Object keys whose values are free-form maps.
const FREE_MAPS: &[&str] = &["annotations", "labels", "Labels"];

/// A key as Go's `encoding/json` compares it with a field name: ASCII case folded, and the two
/// non-ASCII letters that fold to ASCII ones (U+212A KELVIN SIGN to `k`, U+017F LONG S to `s`).
fn folded(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            '\u{212a}' => 'k',
            '\u{17f}' => 's',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// Checks `bytes` by the rules above; the error says what differs.
pub(crate) fn check(bytes: &[u8]) -> Result<(), String> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    Checker { free: false }.deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())
}

#[derive(Clone, Copy)]
struct Checker {
    /// The object is a free-form map (its keys need not be the format's names).
    free: bool,
}

impl<'de> DeserializeSeed<'de> for Checker {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Checker {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JSON")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let f = folded(&key);
            let shown = ccm_identity::text::escaped(&key);
            // A free-form map's keys are compared exactly by Go too.
            if !seen.insert(if self.free { key.clone() } else { f.clone() }) {
                return Err(de::Error::custom(format!(
                    "the key `{shown}` appears twice in one object (equal keys, or keys that differ only in case, \
                     which Go's encoding/json of the runtimes reads as one: the last wins there)"
                )));
            }
            if !self.free {
                if let Some(known) = KNOWN_KEYS.iter().find(|k| folded(k) == f && **k != key) {
                    return Err(de::Error::custom(format!(
                        "the key `{shown}` is not `{known}`, but Go's encoding/json (the runtimes' reader) takes it \
                         for `{known}`"
                    )));
                }
            }
            map.next_value_seed(Checker { free: FREE_MAPS.contains(&key.as_str()) })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Checker { free: false })?.is_some() {}
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_json_passes() {
        check(br#"{"schemaVersion":2,"layers":[{"size":1,"annotations":{"A":"1","a.b":"2"}}]}"#).unwrap();
    }

    #[test]
    fn keys_go_reads_as_one_are_refused() {
        assert!(check(br#"{"layers":[],"layers":[]}"#).unwrap_err().contains("twice"));
        assert!(check(br#"{"layers":[],"Layers":[]}"#).unwrap_err().contains("twice"));
        assert!(check(br#"{"Layers":[]}"#).unwrap_err().contains("takes it for `layers`"));
        assert!(check("{\"\u{17f}ize\":1}".as_bytes()).unwrap_err().contains("`size`"));
        assert!(check(br#"{"annotations":{"x":"1","x":"2"}}"#).unwrap_err().contains("twice"));
        check(br#"{"annotations":{"x":"1","X":"2"}}"#).unwrap();
    }

    #[test]
    fn malformed_json_is_refused() {
        assert!(check(b"{\"a\":\"\xff\"}").is_err());
        assert!(check(br#"{"a":1} {}"#).is_err());
        assert!(check(br#"{"a":"#).is_err());
    }
}
