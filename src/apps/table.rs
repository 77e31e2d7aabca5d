//! The table of app-private paths (pure): each app's path, the bits it refuses, what it does then.

use std::fmt;

use crate::spec::Rule;

/// Group and other permission bits.
pub(super) const GROUP_OTHER: u32 = 0o077;

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
