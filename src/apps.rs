//! App-private paths and the `--modes app-safe` rule (pure): which entries an app insists on
//! keeping private (PostgreSQL's data directory and key, ssh's home, `.ssh` and keys, Erlang's
//! cookie, GnuPG's and etcd's directories), recognised by their names and the names in their
//! directories, and the mode each policy gives an entry.

use std::fmt;

use crate::spec::{Modes, Rule};
use crate::sys::Kind;

/// Group and other permission bits.
const GROUP_OTHER: u32 = 0o077;

/// A path an app keeps private, with the bits it refuses there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AppPath {
    /// A directory holding `PG_VERSION` and `global/`: PostgreSQL's data directory (0700 or
    /// 0750). Its databases' directories (`base/N/`) hold a `PG_VERSION` too, but no `global/`.
    PostgresData,
    /// `server.key` in a PostgreSQL data directory (0600 or less).
    PostgresKey,
    /// `.pgpass`, libpq's password file (0600 or less).
    Pgpass,
    /// A directory holding `.ssh/`: the home sshd checks (no group or other write).
    SshHome,
    /// `.ssh/` itself (no group or other write: sshd's `safe_path` checks every directory up to
    /// `authorized_keys`; ssh-keygen makes it 0700, but 0750 is accepted).
    SshDir,
    /// A file in `.ssh/` other than the public ones: a private key (owner only).
    SshKey,
    /// `.ssh/authorized_keys`, `authorized_keys2` and `config` (no group or other write).
    SshShared,
    /// `.erlang.cookie` (owner only; RabbitMQ keeps it on its data volume).
    ErlangCookie,
    /// A directory holding `pubring.kbx`, `trustdb.gpg` or `private-keys-v1.d/`: a GnuPG
    /// homedir (owner only).
    GnupgHome,
    /// `private-keys-v1.d/`, GnuPG's secret keys (owner only).
    GnupgKeys,
    /// A directory holding etcd's `member/`: its data directory (owner only).
    EtcdData,
    /// `member/` holding `wal/` or `snap/`, and `member/wal/`, `member/snap/`: etcd's member
    /// directories (owner only).
    EtcdMember,
    /// A path the user gave a rule for (`--rule PATH=RULE`): an app volprep does not know.
    Rule(Rule),
}

/// What an app does when it finds a refused bit on one of its paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stance {
    /// It refuses to start (or to use the file); the text is its message.
    Refuses(&'static str),
    /// It warns and goes on; the text is its message.
    Warns(&'static str),
    /// It does not look: the group can read what the app keeps private.
    Exposes,
}

/// One row of the table of app paths: the app, the path, the app's own check (its function or
/// rule, as its source names it), the bits that check refuses, and what the app does then.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub path: AppPath,
    pub app: &'static str,
    pub what: &'static str,
    /// The app's own check, as its source names it.
    pub check: &'static str,
    /// The permission bits the check refuses: what app-safe removes.
    pub refused: u32,
    /// The modes the app accepts, in words.
    pub wants: &'static str,
    pub stance: Stance,
}

const OWNER_ONLY: &str = "owner only";
const NO_WRITE: &str = "no group or other write";
const SSHD: &str = "sshd: Authentication refused: bad ownership or modes for directory";
const ETCD: &str = "etcd: check file permission: the recommended permission is -rwx------";

/// The app paths volprep knows, one row each (the user's rules are not in it).
pub const TABLE: [Row; 12] = [
    Row {
        path: AppPath::PostgresData,
        app: "PostgreSQL",
        what: "data directory",
        check: "checkDataDir (miscinit.c)",
        refused: 0o027,
        wants: "0700 or 0750",
        stance: Stance::Refuses("FATAL: data directory has invalid permissions"),
    },
    Row {
        path: AppPath::PostgresKey,
        app: "PostgreSQL",
        what: "server.key",
        check: "check_ssl_key_file_permissions (be-secure-common.c)",
        refused: GROUP_OTHER,
        wants: OWNER_ONLY,
        stance: Stance::Refuses("FATAL: private key file has group or world access"),
    },
    Row {
        path: AppPath::Pgpass,
        app: "libpq",
        what: "password file",
        check: "PasswordFromFile (fe-connect.c)",
        refused: GROUP_OTHER,
        wants: OWNER_ONLY,
        stance: Stance::Warns("password file has group or world access (and is ignored)"),
    },
    Row {
        path: AppPath::SshHome,
        app: "OpenSSH",
        what: "home directory of .ssh",
        check: "safe_path (misc.c, StrictModes)",
        refused: 0o022,
        wants: NO_WRITE,
        stance: Stance::Refuses(SSHD),
    },
    Row {
        path: AppPath::SshDir,
        app: "OpenSSH",
        what: ".ssh directory",
        check: "safe_path (misc.c, StrictModes)",
        refused: 0o022,
        wants: NO_WRITE,
        stance: Stance::Refuses(SSHD),
    },
    Row {
        path: AppPath::SshKey,
        app: "OpenSSH",
        what: "private key",
        check: "sshkey_perm_ok (authfile.c)",
        refused: GROUP_OTHER,
        wants: OWNER_ONLY,
        stance: Stance::Refuses("ssh: UNPROTECTED PRIVATE KEY FILE"),
    },
    Row {
        path: AppPath::SshShared,
        app: "OpenSSH",
        what: "authorized_keys or config",
        check: "safe_path (misc.c), secure_permissions (readconf.c)",
        refused: 0o022,
        wants: NO_WRITE,
        stance: Stance::Refuses("sshd: bad ownership or modes for file; ssh: Bad owner or permissions"),
    },
    Row {
        path: AppPath::ErlangCookie,
        app: "Erlang",
        what: "cookie",
        check: "check_cookie_file (auth.erl)",
        refused: GROUP_OTHER,
        wants: OWNER_ONLY,
        stance: Stance::Refuses("Cookie file must be accessible by owner only"),
    },
    Row {
        path: AppPath::GnupgHome,
        app: "GnuPG",
        what: "homedir",
        check: "check_permissions (g10/misc.c)",
        refused: GROUP_OTHER,
        wants: OWNER_ONLY,
        stance: Stance::Warns("gpg: WARNING: unsafe permissions on homedir"),
    },
    Row {
        path: AppPath::GnupgKeys,
        app: "GnuPG",
        what: "private keys directory",
        check: "none (gpg-agent reads it as it is)",
        refused: GROUP_OTHER,
        wants: OWNER_ONLY,
        stance: Stance::Exposes,
    },
    Row {
        path: AppPath::EtcdData,
        app: "etcd",
        what: "data directory",
        check: "fileutil.CheckDirPermission",
        refused: GROUP_OTHER,
        wants: OWNER_ONLY,
        stance: Stance::Warns(ETCD),
    },
    Row {
        path: AppPath::EtcdMember,
        app: "etcd",
        what: "member directory",
        check: "fileutil.CheckDirPermission",
        refused: GROUP_OTHER,
        wants: OWNER_ONLY,
        stance: Stance::Warns(ETCD),
    },
];

impl AppPath {
    /// Every app path of the table.
    #[cfg(test)]
    pub const ALL: [AppPath; 12] = {
        let mut all = [AppPath::PostgresData; 12];
        let mut i = 0;
        while i < 12 {
            all[i] = TABLE[i].path;
            i += 1;
        }
        all
    };

    /// This path's row of the table; `None` for a user's rule.
    pub fn row(self) -> Option<&'static Row> {
        TABLE.iter().find(|r| r.path == self)
    }

    /// The permission bits the app refuses on this path: what app-safe removes.
    pub fn refused(self) -> u32 {
        match (self, self.row()) {
            (_, Some(row)) => row.refused,
            (AppPath::Rule(Rule::Mode(m)), None) => 0o7777 & !m,
            (AppPath::Rule(Rule::Keep), None) => 0,
            _ => GROUP_OTHER,
        }
    }

    /// The app (`PostgreSQL`, `OpenSSH` ...).
    pub fn app(self) -> &'static str {
        self.row().map_or("your rule", |r| r.app)
    }

    /// What the path is, in a few words (`data directory`).
    pub fn what(self) -> &'static str {
        match (self, self.row()) {
            (_, Some(row)) => row.what,
            (AppPath::Rule(Rule::Mode(_)), None) => "exact mode",
            (AppPath::Rule(Rule::Keep), None) => "keep",
            _ => "owner-only",
        }
    }

    /// The modes the app accepts, in words.
    pub fn wants(self) -> &'static str {
        match (self, self.row()) {
            (_, Some(row)) => row.wants,
            (AppPath::Rule(Rule::Mode(_)), None) => "the mode of its rule",
            (AppPath::Rule(Rule::Keep), None) => "its mode kept",
            _ => OWNER_ONLY,
        }
    }

    /// What the app does with a refused bit here.
    pub fn stance(self) -> Stance {
        self.row().map_or(Stance::Refuses("(your rule for this path)"), |r| r.stance)
    }

    /// Whether the app accepts permission bits `perm` here.
    pub fn accepts(self, perm: u32) -> bool {
        match self {
            AppPath::Rule(Rule::Mode(m)) => perm == m,
            _ => perm & self.refused() == 0,
        }
    }
}

impl fmt::Display for AppPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AppPath::Rule(r) => write!(f, "your rule {r}"),
            _ => write!(f, "{} {}", self.app(), self.what()),
        }
    }
}

/// Whose entries a private path's rule applies to: the uid that owns the app's path (the data
/// directory, the home holding `.ssh`, ...), once `--owner` is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    /// The entry is the app's path itself: it applies.
    Itself,
    /// It applies when the entry's owner (after `--owner`) is this uid.
    Owner(u32),
}

/// An entry at an app-private path, and whose it must be for app-safe to tighten it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Private {
    pub path: AppPath,
    pub anchor: Anchor,
}

impl Private {
    /// Whether the rule applies to an entry whose owner (after `--owner`) is `owner`.
    pub fn applies_to(&self, owner: u32) -> bool {
        match self.anchor {
            Anchor::Itself => true,
            Anchor::Owner(uid) => uid == owner,
        }
    }
}

/// Whose an entry is, as app-safe sees it: its owner once `--owner` is applied, and the uid the
/// app runs as (`None`: not known).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Whose {
    pub owner: u32,
    pub app: Option<u32>,
}

impl Whose {
    /// Whether the app owns the entry: only then may app-safe keep it private or tighten it.
    pub fn is_app(self) -> bool {
        self.app == Some(self.owner)
    }
}

/// How many names a non-directory has: a hard link may be an inode of outside the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    One,
    Many,
}

impl Links {
    /// A directory's link count counts its subdirectories, not other names: it is `One`.
    pub fn of(kind: Kind, nlink: u64) -> Links {
        if kind != Kind::Dir && nlink > 1 { Links::Many } else { Links::One }
    }
}

/// The mode bits a policy wants for a non-symlink entry, or `None` when it leaves them alone.
///
/// - `kubelet`: `old | mask` (the kubelet's rule); no mask (`--owner` alone): untouched.
/// - `app-safe`: an entry the app does not own (its uid not known, or another uid's) gets the
///   kubelet's bits: the app reaches it only through the group. An entry the app owns at an
///   app-private path whose rule applies to it loses the bits its app refuses and gains none;
///   with more than one link it is left as it is (the same inode may be outside the volume).
///   Any other entry of the app with no group or other bit keeps its mode; the rest get
///   `old | mask`. No mask: only the tightening.
///
/// A user's rule (`--rule`): `keep` leaves the mode; an exact mode is given whoever owns the
/// entry (not through a hard link: left); `owner-only` is an app path refusing group and other
/// bits.
///
/// So app-safe never adds a bit to an app-private path of the app, never removes one from
/// another path, nor from an entry the app does not own, nor through a hard link, but where the
/// user's rule names an exact mode.
pub fn want_mode(
    modes: Modes,
    old: u32,
    mask: Option<u32>,
    private: Option<Private>,
    whose: Whose,
    links: Links,
) -> Option<u32> {
    if modes == Modes::Kubelet {
        return mask.map(|m| old | m);
    }
    match private.map(|p| p.path) {
        Some(AppPath::Rule(Rule::Keep)) => return mask.map(|_| old),
        Some(AppPath::Rule(Rule::Mode(m))) if links == Links::One => return Some(m),
        Some(AppPath::Rule(Rule::Mode(_))) => return mask.map(|_| old),
        _ => {}
    }
    if !whose.is_app() {
        return mask.map(|m| old | m);
    }
    match private.filter(|p| p.applies_to(whose.owner)) {
        Some(p) if links == Links::One => Some(old & !p.path.refused()),
        Some(_) => mask.map(|_| old),
        None if old & GROUP_OTHER == 0 => mask.map(|_| old),
        None => mask.map(|m| old | m),
    }
}

/// Whether app-safe leaves an app-private path of the app as it is, although its app refuses
/// its mode, because it has more than one link: what a pass warns of.
pub fn held_back(private: Option<Private>, old: u32, whose: Whose, links: Links) -> Option<AppPath> {
    let exact = |p: &Private| matches!(p.path, AppPath::Rule(Rule::Mode(_)));
    let p = private.filter(|p| exact(p) || (whose.is_app() && p.applies_to(whose.owner)))?;
    (links == Links::Many && !p.path.accepts(old)).then_some(p.path)
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Rule;

    const APP: u32 = 2000;

    fn dir<'n>(name: &'n [u8], signs: Signs, parent_owner: Option<u32>) -> DirFacts<'n> {
        DirFacts { name, parent_name: b"x", signs, parent_owner }
    }

    fn parent(name: &[u8]) -> ParentFacts<'_> {
        ParentFacts { name, owner: APP, grand_owner: Some(APP) }
    }

    fn mask(kind: Kind) -> Option<u32> {
        crate::spec::Spec::group(1).mode_mask(kind)
    }

    const OURS: Whose = Whose { owner: APP, app: Some(APP) };
    const ONE: Links = Links::One;

    #[test]
    fn kubelet_is_the_kubelets_formula_whatever_the_place() {
        for old in 0..=0o7777 {
            for private in [None, Some(Private { path: AppPath::PostgresData, anchor: Anchor::Itself })] {
                let want = |mask| want_mode(Modes::Kubelet, old, mask, private, OURS, ONE);
                assert_eq!(want(mask(Kind::Dir)), Some(old | 0o2770));
                assert_eq!(want(mask(Kind::File)), Some(old | 0o660));
                assert_eq!(want(None), None, "--owner alone");
            }
        }
    }

    /// The rule's promises, over every mode and every app path, ours or another uid's.
    #[test]
    fn app_safe_never_widens_a_private_path_nor_narrows_another() {
        for old in 0..=0o7777u32 {
            for kind in [Kind::File, Kind::Dir] {
                let m = mask(kind);
                // Not an app path: bits are only added, and only when some group/other bit is set.
                let plain = want_mode(Modes::AppSafe, old, m, None, OURS, ONE).unwrap();
                assert_eq!(plain & old, old, "{old:o}: nothing removed");
                if old & 0o077 == 0 {
                    assert_eq!(plain, old, "{old:o}: no group/other bits, mode kept");
                } else {
                    assert_eq!(plain, old | m.unwrap(), "{old:o}: the kubelet's bits");
                }
                for path in AppPath::ALL {
                    let ours = Private { path, anchor: Anchor::Owner(APP) };
                    let want = want_mode(Modes::AppSafe, old, m, Some(ours), OURS, ONE).unwrap();
                    assert_eq!(want, old & !path.refused(), "{path:?} {old:o}: only the refused bits go");
                    assert!(path.accepts(want), "{path:?} {old:o}: the app accepts the result");
                    // An entry the app does not own gets the kubelet's bits: nothing removed.
                    for whose in [Whose { owner: 3000, app: Some(APP) }, Whose { owner: APP, app: None }] {
                        let theirs = want_mode(Modes::AppSafe, old, m, Some(ours), whose, ONE);
                        assert_eq!(theirs, Some(old | m.unwrap()), "{path:?} {old:o} {whose:?}");
                    }
                    // A hard link is left as it is.
                    assert_eq!(want_mode(Modes::AppSafe, old, m, Some(ours), OURS, Links::Many), Some(old));
                    // The result is a fixed point.
                    assert_eq!(want_mode(Modes::AppSafe, want, m, Some(ours), OURS, ONE), Some(want));
                }
                assert_eq!(want_mode(Modes::AppSafe, plain, m, None, OURS, ONE), Some(plain), "{old:o}: fixed point");
            }
        }
    }

    #[test]
    fn app_safe_with_owner_alone_only_tightens() {
        let key = Private { path: AppPath::SshKey, anchor: Anchor::Itself };
        assert_eq!(want_mode(Modes::AppSafe, 0o660, None, Some(key), OURS, ONE), Some(0o600));
        assert_eq!(want_mode(Modes::AppSafe, 0o664, None, None, OURS, ONE), None);
        assert_eq!(want_mode(Modes::AppSafe, 0o600, None, None, OURS, ONE), None);
        let theirs = Private { anchor: Anchor::Owner(1), ..key };
        assert_eq!(want_mode(Modes::AppSafe, 0o660, None, Some(theirs), OURS, ONE), None);
    }

    #[test]
    fn private_keys_are_known_by_their_names() {
        for key in [
            "tls.key",
            "server.KEY",
            "wg0.private",
            "node_secret_key",
            "id_ed25519",
            "id_rsa",
            "privkey.pem",
            "tls-key.pem",
        ] {
            assert!(looks_like_private_key(key.as_bytes()), "{key}");
        }
        for not in ["id_ed25519.pub", "tls.crt", "cert.pem", "keys", "monkey.txt", "key.pub"] {
            assert!(!looks_like_private_key(not.as_bytes()), "{not}");
        }
    }

    #[test]
    fn the_users_rules() {
        let rule = |r| Some(Private { path: AppPath::Rule(r), anchor: Anchor::Itself });
        let theirs = Whose { owner: 3000, app: Some(APP) };
        let m = mask(Kind::File);
        for old in 0..=0o7777u32 {
            // owner-only: the app's entry loses its group and other bits; another's is the kubelet's.
            assert_eq!(want_mode(Modes::AppSafe, old, m, rule(Rule::OwnerOnly), OURS, ONE), Some(old & !0o077));
            assert_eq!(want_mode(Modes::AppSafe, old, m, rule(Rule::OwnerOnly), theirs, ONE), Some(old | 0o660));
            // An exact mode, whoever owns it, but not through a hard link.
            for whose in [OURS, theirs, Whose { owner: APP, app: None }] {
                assert_eq!(want_mode(Modes::AppSafe, old, m, rule(Rule::Mode(0o755)), whose, ONE), Some(0o755));
                assert_eq!(want_mode(Modes::AppSafe, old, m, rule(Rule::Keep), whose, ONE), Some(old));
            }
            assert_eq!(want_mode(Modes::AppSafe, old, m, rule(Rule::Mode(0o755)), OURS, Links::Many), Some(old));
        }
        assert_eq!(
            held_back(rule(Rule::Mode(0o755)), 0o777, theirs, Links::Many),
            Some(AppPath::Rule(Rule::Mode(0o755)))
        );
        assert!(AppPath::Rule(Rule::Mode(0o2755)).accepts(0o2755) && !AppPath::Rule(Rule::Mode(0o2755)).accepts(0o755));
        assert_eq!(AppPath::Rule(Rule::Mode(0o755)).to_string(), "your rule 0755");
    }

    #[test]
    fn a_hard_linked_app_path_is_held_back_and_said() {
        let cookie = Some(Private { path: AppPath::ErlangCookie, anchor: Anchor::Itself });
        assert_eq!(held_back(cookie, 0o660, OURS, Links::Many), Some(AppPath::ErlangCookie));
        assert_eq!(held_back(cookie, 0o600, OURS, Links::Many), None, "accepted as it is");
        assert_eq!(held_back(cookie, 0o660, OURS, ONE), None, "tightened");
        assert_eq!(held_back(cookie, 0o660, Whose { owner: 3000, app: Some(APP) }, Links::Many), None, "not the app's");
        assert_eq!(Links::of(Kind::Dir, 5), ONE);
        assert_eq!(Links::of(Kind::File, 2), Links::Many);
    }

    #[test]
    fn a_volume_the_kubelet_widened_comes_back_to_what_each_app_accepts() {
        // Dirs 2770, files 0660, as an earlier kubelet left them.
        let cases = [
            (AppPath::PostgresData, 0o2770, 0o2750),
            (AppPath::PostgresKey, 0o660, 0o600),
            (AppPath::SshHome, 0o2770, 0o2750),
            (AppPath::SshDir, 0o2770, 0o2750),
            (AppPath::SshKey, 0o660, 0o600),
            (AppPath::SshShared, 0o660, 0o640),
            (AppPath::ErlangCookie, 0o660, 0o600),
            (AppPath::GnupgHome, 0o2770, 0o2700),
            (AppPath::EtcdData, 0o2770, 0o2700),
        ];
        for (path, old, want) in cases {
            let p = Private { path, anchor: Anchor::Itself };
            assert_eq!(
                want_mode(
                    Modes::AppSafe,
                    old,
                    mask(if old > 0o777 { Kind::Dir } else { Kind::File }),
                    Some(p),
                    OURS,
                    ONE
                ),
                Some(want),
                "{path:?}"
            );
            assert!(!path.accepts(old) && path.accepts(want), "{path:?}");
        }
    }

    #[test]
    fn directories_are_known_by_their_entries_and_names() {
        let never = || panic!("not asked");
        let pg_signs = Signs::PG_VERSION.with(Signs::PG_GLOBAL);
        let pg = dir(b"pgdata", pg_signs, Some(APP));
        assert_eq!(classify_dir(&pg, never), Some(Private { path: AppPath::PostgresData, anchor: Anchor::Itself }));
        let database = dir(b"5", Signs::PG_VERSION, Some(APP));
        assert_eq!(classify_dir(&database, never), None, "base/5 of a data directory holds a PG_VERSION too");
        let root_pg = dir(b"", pg_signs, None);
        assert_eq!(classify_dir(&root_pg, never).map(|p| p.path), Some(AppPath::PostgresData), "PGDATA as the root");
        let home = dir(b"", Signs::SSH, None);
        assert_eq!(classify_dir(&home, never).map(|p| p.path), Some(AppPath::SshHome));
        let ssh = dir(b".ssh", Signs::NONE, Some(APP));
        assert_eq!(classify_dir(&ssh, never), Some(Private { path: AppPath::SshDir, anchor: Anchor::Owner(APP) }));
        let gpg = dir(b"gnupg", Signs::GNUPG, Some(0));
        assert_eq!(classify_dir(&gpg, never).map(|p| p.path), Some(AppPath::GnupgHome));
        let keys = dir(b"private-keys-v1.d", Signs::NONE, Some(APP));
        assert_eq!(classify_dir(&keys, never).map(|p| p.path), Some(AppPath::GnupgKeys));
        // etcd: member/ counts only with wal/ or snap/ in it.
        let member = dir(b"member", Signs::ETCD_LOG, Some(APP));
        assert_eq!(classify_dir(&member, never).map(|p| p.path), Some(AppPath::EtcdMember));
        assert_eq!(classify_dir(&dir(b"member", Signs::NONE, Some(APP)), never), None);
        let wal = DirFacts { parent_name: b"member", ..dir(b"wal", Signs::NONE, Some(APP)) };
        assert_eq!(classify_dir(&wal, never).map(|p| p.path), Some(AppPath::EtcdMember), "etcd checks member/wal too");
        assert_eq!(classify_dir(&dir(b"wal", Signs::NONE, Some(APP)), never), None, "a wal/ elsewhere");
        let data = dir(b"data", Signs::MEMBER, Some(APP));
        assert_eq!(classify_dir(&data, || true).map(|p| p.path), Some(AppPath::EtcdData));
        assert_eq!(classify_dir(&data, || false), None, "a member/ of something else");
        // Nothing else is an app path.
        for plain in [dir(b"data", Signs::NONE, Some(APP)), dir(b"ssh", Signs::NONE, Some(APP))] {
            assert_eq!(classify_dir(&plain, never), None);
        }
        // Several apps: the one refusing the most bits wins (GnuPG's owner-only over sshd's).
        let both = dir(b"home", Signs::SSH.with(Signs::GNUPG), Some(APP));
        assert_eq!(classify_dir(&both, never).map(|p| p.path), Some(AppPath::GnupgHome));
    }

    #[test]
    fn files_are_known_by_their_names_and_their_directory() {
        let never = || panic!("not asked");
        let any = parent(b"data");
        let class = |name: &[u8], p: &ParentFacts<'_>| classify_file(name, Kind::File, p, || true).map(|p| p.path);
        assert_eq!(class(b".erlang.cookie", &any), Some(AppPath::ErlangCookie));
        assert_eq!(class(b".pgpass", &any), Some(AppPath::Pgpass));
        assert_eq!(
            classify_file(b"server.key", Kind::File, &any, || true),
            Some(Private { path: AppPath::PostgresKey, anchor: Anchor::Owner(APP) })
        );
        assert_eq!(classify_file(b"server.key", Kind::File, &any, || false), None, "not in a data directory");
        let ssh = ParentFacts { name: b".ssh", owner: 7, grand_owner: Some(APP) };
        let anchored = |name: &[u8]| classify_file(name, Kind::File, &ssh, never);
        assert_eq!(anchored(b"id_ed25519"), Some(Private { path: AppPath::SshKey, anchor: Anchor::Owner(APP) }));
        assert_eq!(anchored(b"deploy_key").map(|p| p.path), Some(AppPath::SshKey));
        assert_eq!(anchored(b"authorized_keys").map(|p| p.path), Some(AppPath::SshShared));
        assert_eq!(anchored(b"config").map(|p| p.path), Some(AppPath::SshShared));
        assert_eq!(anchored(b"id_ed25519.pub"), None);
        assert_eq!(anchored(b"known_hosts"), None);
        assert_eq!(anchored(b"known_hosts.old"), None);
        assert_eq!(classify_file(b"id_rsa", Kind::File, &parent(b"keys"), never), None, "outside .ssh");
        assert_eq!(classify_file(b".erlang.cookie", Kind::Symlink, &any, never), None, "a symlink has no mode");
        assert_eq!(classify_file(b"id_rsa", Kind::Socket, &ssh, never), None, "a socket in .ssh");
        // `.ssh` as the volume root: its own owner anchors.
        let root_ssh = ParentFacts { name: b".ssh", owner: 7, grand_owner: None };
        assert_eq!(classify_file(b"id_rsa", Kind::File, &root_ssh, never).map(|p| p.anchor), Some(Anchor::Owner(7)));
    }

    #[test]
    fn signs_come_from_names_of_the_right_kind() {
        for (name, kind) in Signs::NAMES {
            assert!(!Signs::of(name.as_bytes(), kind).is_empty(), "{name}");
            let other = if kind == Kind::Dir { Kind::File } else { Kind::Dir };
            assert!(Signs::of(name.as_bytes(), other).is_empty(), "{name} as {other:?}");
            assert!(Signs::of(name.as_bytes(), Kind::Symlink).is_empty(), "{name} as a symlink");
        }
        assert!(Signs::of(b"pg_version", Kind::File).is_empty());
        let s = Signs::PG_VERSION.with(Signs::SSH);
        assert!(s.has(Signs::PG_VERSION) && s.has(Signs::SSH) && !s.has(Signs::GNUPG));
        assert!(!s.has(Signs::NONE));
    }

    /// The reference's table names each row's check, as the code's table does.
    #[test]
    fn the_reference_names_each_apps_check() {
        let reference = include_str!("../docs/reference.md");
        for row in TABLE {
            assert!(reference.contains(&format!("`{}`", row.check)), "{:?}: {}", row.path, row.check);
            assert_eq!(row.path.refused(), row.refused);
        }
    }

    #[test]
    fn every_app_path_says_what_its_app_does() {
        for path in AppPath::ALL {
            assert!(!path.accepts(path.refused()), "{path:?}");
            assert!(path.accepts(0o700), "{path:?}: owner-only is always fine");
            assert!(!path.to_string().is_empty() && !path.wants().is_empty());
        }
        assert!(AppPath::PostgresData.accepts(0o2750));
        assert!(!AppPath::SshHome.accepts(0o2770) && AppPath::SshHome.accepts(0o2750));
    }
}
