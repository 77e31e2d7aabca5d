//! Which app-private path an entry is (pure): from its name and the names its directory holds.

use crate::sys::Kind;

use super::table::{Anchor, AppPath, Private};

/// Whether a file's name looks like a private key's (`*.key`, `*.private`, `*_secret_key`,
/// `id_*` but `*.pub`, `*key*.pem`): `inspect` lists those the group can read.
pub fn looks_like_private_key(name: &[u8]) -> bool {
    let lower = name.to_ascii_lowercase();
    let n = lower.as_slice();
    if n.ends_with(b".pub") {
        return false;
    }
    n.ends_with(b".key")
        || n.ends_with(b".private")
        || n.ends_with(b"_secret_key")
        || n.starts_with(b"id_")
        || (n.ends_with(b".pem") && n.windows(3).any(|w| w == b"key"))
}

/// What an entry tells its directory about it (a bit set): a directory holding `PG_VERSION` is a
/// PostgreSQL data directory, one holding `.ssh/` a home, and so on. Collected from the names of
/// a directory's entries as they are read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Signs(u8);

impl Signs {
    pub const NONE: Signs = Signs(0);
    /// A regular file `PG_VERSION`.
    pub const PG_VERSION: Signs = Signs(1);
    /// A directory `global` (PostgreSQL's cluster-wide tables).
    pub const PG_GLOBAL: Signs = Signs(32);
    /// A directory `.ssh`.
    pub const SSH: Signs = Signs(2);
    /// `pubring.kbx` or `trustdb.gpg` (files), `private-keys-v1.d` (a directory).
    pub const GNUPG: Signs = Signs(4);
    /// A directory `member`.
    pub const MEMBER: Signs = Signs(8);
    /// A directory `wal` or `snap` (in etcd's `member/`).
    pub const ETCD_LOG: Signs = Signs(16);

    /// The names (with the kind they must have) that give a sign: a directory's signs are also
    /// found by looking these up in it.
    pub const NAMES: [(&'static str, Kind); 9] = [
        ("PG_VERSION", Kind::File),
        ("global", Kind::Dir),
        (".ssh", Kind::Dir),
        ("pubring.kbx", Kind::File),
        ("trustdb.gpg", Kind::File),
        ("private-keys-v1.d", Kind::Dir),
        ("member", Kind::Dir),
        ("wal", Kind::Dir),
        ("snap", Kind::Dir),
    ];

    /// The sign an entry `name` of `kind` gives its directory.
    pub fn of(name: &[u8], kind: Kind) -> Signs {
        match (name, kind) {
            (b"PG_VERSION", Kind::File) => Signs::PG_VERSION,
            (b"global", Kind::Dir) => Signs::PG_GLOBAL,
            (b".ssh", Kind::Dir) => Signs::SSH,
            (b"pubring.kbx" | b"trustdb.gpg", Kind::File) | (b"private-keys-v1.d", Kind::Dir) => Signs::GNUPG,
            (b"member", Kind::Dir) => Signs::MEMBER,
            (b"wal" | b"snap", Kind::Dir) => Signs::ETCD_LOG,
            _ => Signs::NONE,
        }
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn has(self, s: Signs) -> bool {
        self.0 & s.0 == s.0 && !s.is_empty()
    }

    pub fn with(self, s: Signs) -> Signs {
        Signs(self.0 | s.0)
    }
}

/// What classifying a directory needs to know about it.
#[derive(Debug, Clone, Copy)]
pub struct DirFacts<'n> {
    /// Its name in its parent (empty for the volume root).
    pub name: &'n [u8],
    /// Its parent's name (empty for the volume root and its entries).
    pub parent_name: &'n [u8],
    /// The signs of its entries.
    pub signs: Signs,
    /// Its parent's owner after `--owner` (`None` for the volume root).
    pub parent_owner: Option<u32>,
}

/// The app path a directory is, if any. `etcd_member` says whether its `member/` holds `wal/`
/// or `snap/` (asked only when it has a `member/`). Where several apply, the one refusing the
/// most bits wins.
pub fn classify_dir(d: &DirFacts<'_>, etcd_member: impl FnOnce() -> bool) -> Option<Private> {
    let by_parent = |path| {
        let anchor = d.parent_owner.map_or(Anchor::Itself, Anchor::Owner);
        Some(Private { path, anchor })
    };
    let itself = |path| Some(Private { path, anchor: Anchor::Itself });
    match d.name {
        b".ssh" if d.parent_owner.is_some() => return by_parent(AppPath::SshDir),
        b"private-keys-v1.d" if d.parent_owner.is_some() => return by_parent(AppPath::GnupgKeys),
        b"member" if d.parent_owner.is_some() && d.signs.has(Signs::ETCD_LOG) => {
            return by_parent(AppPath::EtcdMember);
        }
        b"wal" | b"snap" if d.parent_name == b"member" => return by_parent(AppPath::EtcdMember),
        _ => {}
    }
    if d.signs.has(Signs::GNUPG) {
        itself(AppPath::GnupgHome)
    } else if d.signs.has(Signs::MEMBER) && etcd_member() {
        itself(AppPath::EtcdData)
    } else if d.signs.has(Signs::PG_VERSION.with(Signs::PG_GLOBAL)) {
        itself(AppPath::PostgresData)
    } else if d.signs.has(Signs::SSH) {
        itself(AppPath::SshHome)
    } else {
        None
    }
}

/// What classifying a non-directory entry needs to know about its directory.
#[derive(Debug, Clone, Copy)]
pub struct ParentFacts<'n> {
    /// The directory's name (empty for the volume root).
    pub name: &'n [u8],
    /// Its owner after `--owner`.
    pub owner: u32,
    /// Its parent's owner after `--owner` (`None` when it is the volume root).
    pub grand_owner: Option<u32>,
}

/// The app path a non-directory entry `name` of `kind` is, if any. `pg_data_parent` says
/// whether its directory is a PostgreSQL data directory (holds `PG_VERSION` and `global/`;
/// asked only for `server.key`).
pub fn classify_file(
    name: &[u8],
    kind: Kind,
    parent: &ParentFacts<'_>,
    pg_data_parent: impl FnOnce() -> bool,
) -> Option<Private> {
    if kind != Kind::File {
        return None;
    }
    let itself = |path| Some(Private { path, anchor: Anchor::Itself });
    match name {
        b".erlang.cookie" => return itself(AppPath::ErlangCookie),
        b".pgpass" => return itself(AppPath::Pgpass),
        b"server.key" if pg_data_parent() => {
            return Some(Private { path: AppPath::PostgresKey, anchor: Anchor::Owner(parent.owner) });
        }
        _ => {}
    }
    if parent.name != b".ssh" {
        return None;
    }
    // The home's owner, when `.ssh` is not the volume root.
    let anchor = Anchor::Owner(parent.grand_owner.unwrap_or(parent.owner));
    let path = match name {
        b"authorized_keys" | b"authorized_keys2" | b"config" => AppPath::SshShared,
        n if n.ends_with(b".pub") || n.starts_with(b"known_hosts") => return None,
        _ => AppPath::SshKey,
    };
    Some(Private { path, anchor })
}
