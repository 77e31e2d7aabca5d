//! A special-bit record: a file whose setuid/setgid bits a chown is about to clear, and the mode to give back.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One file between its chown and its chmod, as kept on the root: on the wire a JSON array
/// `[path, inode, mode]` (the format of every version so far).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialRecord {
    /// The path relative to the volume root, escaped (see `escape::unescape`).
    pub path: String,
    /// The file's inode: a record names this file, not whatever lies at its path later.
    pub ino: u64,
    /// The mode to restore, special bits included.
    pub mode: u32,
}

impl Serialize for SpecialRecord {
    fn serialize<S: Serializer>(&self, to: S) -> Result<S::Ok, S::Error> {
        (&self.path, self.ino, self.mode).serialize(to)
    }
}

impl<'de> Deserialize<'de> for SpecialRecord {
    fn deserialize<D: Deserializer<'de>>(from: D) -> Result<Self, D::Error> {
        let (path, ino, mode) = <(String, u64, u32)>::deserialize(from)?;
        Ok(SpecialRecord { path, ino, mode })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_format_is_the_array_of_earlier_versions() {
        // As written by every version before the record had a name.
        let old = r#"[["bin/tool",1234,3565],["a\\x0ab",7,1517]]"#;
        let records: Vec<SpecialRecord> = serde_json::from_str(old).unwrap();
        assert_eq!(records[0], SpecialRecord { path: "bin/tool".into(), ino: 1234, mode: 0o6755 });
        assert_eq!(records[1].path, "a\\x0ab");
        assert_eq!(serde_json::to_string(&records).unwrap(), old);
    }
}
