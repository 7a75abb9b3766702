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

/// Keys whose value is an object in the image format (a Go struct), and keys whose value is an array of them. serde
/// reads a struct from an array too (its fields in order: `[1,2,3]` as a config, a descriptor as `["type","sha256:..",
/// 1]`); Go's encoding/json refuses anything but an object (or `null`) there, and so does this check.
const OBJECT_KEYS: &[&str] = &["config", "rootfs", "platform", "subject"];
const OBJECT_ARRAY_KEYS: &[&str] = &["manifests", "layers", "history"];

/// What a value must be.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Shape {
    Any,
    /// An object or `null` (the key named, for messages: `None` at the top).
    Object(Option<&'static str>),
    /// An array of objects (or `null`).
    ObjectArray(&'static str),
    /// An element of such an array: an object.
    Element(&'static str),
}

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
pub(crate) fn check(bytes: &[u8]) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    Checker { free: false, shape: Shape::Object(None) }.deserialize(&mut de)?;
    de.end()
}

#[derive(Clone, Copy)]
struct Checker {
    /// The object is a free-form map (its keys need not be the format's names).
    free: bool,
    /// What the value must be.
    shape: Shape,
}

impl Checker {
    /// Refuses a value of another kind than [`Checker::shape`] allows.
    fn kind<E: de::Error>(&self, found: &str) -> Result<(), E> {
        let object = match self.shape {
            Shape::Object(Some(k)) => format!("the value of `{k}`"),
            Shape::Element(k) => format!("an element of `{k}`"),
            _ => "the document".to_string(),
        };
        match self.shape {
            Shape::Any => Ok(()),
            Shape::Object(_) | Shape::Element(_) if found != "an object" && found != "null" => Err(E::custom(format!(
                "{object} is {found}, and Go's encoding/json (the runtimes' reader) takes nothing but an object there"
            ))),
            Shape::ObjectArray(key) if found != "an array" && found != "null" => Err(E::custom(format!(
                "the value of `{key}` is {found}, and Go's encoding/json (the runtimes' reader) takes nothing but an \
                 array of objects there"
            ))),
            _ => Ok(()),
        }
    }
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
        self.kind("an object")?;
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
            let object = OBJECT_KEYS.iter().find(|k| **k == key);
            let array = OBJECT_ARRAY_KEYS.iter().find(|k| **k == key);
            let shape = match (self.free, object, array) {
                (false, Some(k), _) => Shape::Object(Some(k)),
                (false, None, Some(k)) => Shape::ObjectArray(k),
                _ => Shape::Any,
            };
            map.next_value_seed(Checker { free: FREE_MAPS.contains(&key.as_str()), shape })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.kind("an array")?;
        let shape = match self.shape {
            Shape::ObjectArray(key) => Shape::Element(key),
            _ => Shape::Any,
        };
        while seq.next_element_seed(Checker { free: false, shape })?.is_some() {}
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.kind("a boolean")
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.kind("a number")
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.kind("a number")
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.kind("a number")
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.kind("a string")
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.kind("null")
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
        assert!(check(br#"{"layers":[],"layers":[]}"#).unwrap_err().to_string().contains("twice"));
        assert!(check(br#"{"layers":[],"Layers":[]}"#).unwrap_err().to_string().contains("twice"));
        assert!(check(br#"{"Layers":[]}"#).unwrap_err().to_string().contains("takes it for `layers`"));
        assert!(check("{\"\u{17f}ize\":1}".as_bytes()).unwrap_err().to_string().contains("`size`"));
        assert!(check(br#"{"annotations":{"x":"1","x":"2"}}"#).unwrap_err().to_string().contains("twice"));
        check(br#"{"annotations":{"x":"1","X":"2"}}"#).unwrap();
    }

    #[test]
    fn arrays_where_go_reads_a_struct_are_refused() {
        assert!(check(b"[1,2,3]").unwrap_err().to_string().contains("the document is an array"));
        assert!(check(br#"{"rootfs":["layers",[]]}"#)
            .unwrap_err()
            .to_string()
            .contains("the value of `rootfs` is an array"));
        assert!(check(br#"{"layers":[["t","sha256:x",1]]}"#)
            .unwrap_err()
            .to_string()
            .contains("an element of `layers` is an array"));
        assert!(check(br#"{"manifests":{}}"#).unwrap_err().to_string().contains("an array of objects"));
        check(br#"{"config":null,"layers":null,"rootfs":{"diff_ids":["a"]},"annotations":{"config":"x"}}"#).unwrap();
    }

    #[test]
    fn malformed_json_is_refused() {
        assert!(check(b"{\"a\":\"\xff\"}").is_err());
        assert!(check(br#"{"a":1} {}"#).is_err());
        assert!(check(br#"{"a":"#).is_err());
    }
}
