//! The desired state of a volume (group, owner, mode masks, mode policy) and its stable digest.

use sha2::Digest as _;
use sha2::Sha256;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::escape::escape_bytes;
use crate::sys::Kind;

/// Group read/write bits the kubelet adds to every non-symlink (`rwMask`).
pub const RW_MASK: u32 = 0o660;
/// Group/user read bits for read-only volumes (`roMask`).
pub const RO_MASK: u32 = 0o440;
/// Search bits added to directories (`execMask`).
pub const EXEC_MASK: u32 = 0o110;

/// `--modes`: how an entry's mode bits are decided.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Modes {
    /// The kubelet's rule, exactly: `old_mode | mask` for every non-symlink (`--owner` alone:
    /// modes untouched).
    #[default]
    Kubelet,
    /// The group gets what it needs without widening what an app keeps private: an entry with
    /// no group or other bits keeps its mode, and known app-private paths lose the bits their
    /// app refuses (see `apps`).
    AppSafe,
}

impl Modes {
    /// Every policy, in the order `--help` lists them.
    pub const ALL: [Modes; 2] = [Modes::Kubelet, Modes::AppSafe];

    /// The word on the command line, in `--volume`, the spec text and the marker.
    pub fn word(self) -> &'static str {
        match self {
            Modes::Kubelet => "kubelet",
            Modes::AppSafe => "app-safe",
        }
    }
}

impl fmt::Display for Modes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.word())
    }
}

impl std::str::FromStr for Modes {
    type Err = String;

    fn from_str(s: &str) -> Result<Modes, String> {
        Modes::ALL
            .into_iter()
            .find(|m| m.word().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("'{s}' is not a mode policy: kubelet or app-safe"))
    }
}

/// How the volume is mounted, as the kubelet's mode rule sees it (`--read-only`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Access {
    /// Mask 0660 (`rwMask`).
    #[default]
    ReadWrite,
    /// `--read-only`: mask 0440 (`roMask`).
    ReadOnly,
}

impl Access {
    /// `--read-only` (or `read-only` in `--volume`) given or not.
    pub fn from_flag(read_only: bool) -> Access {
        if read_only { Access::ReadOnly } else { Access::ReadWrite }
    }

    /// The group and owner bits the kubelet ORs into every non-symlink's mode.
    pub fn mask(self) -> u32 {
        match self {
            Access::ReadWrite => RW_MASK,
            Access::ReadOnly => RO_MASK,
        }
    }
}

/// What every entry of a volume must look like. Immutable once built by `cli`. The default
/// asks for nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spec {
    /// `--fs-group`: the kubelet's fsGroup; also turns on the mode policy.
    pub fs_group: Option<u32>,
    /// `--owner UID[:GID]`: the owner uid.
    pub owner_uid: Option<u32>,
    /// `--owner UID:GID`: the group, used when `fs_group` is not set.
    pub owner_gid: Option<u32>,
    /// `--read-only`: mask 0440 instead of 0660.
    pub access: Access,
    /// `--modes`: the kubelet's mode rule, or app-safe.
    pub modes: Modes,
    /// `--app-uid`: the uid the app runs as (app-safe keeps private modes only on its entries).
    pub app_uid: Option<u32>,
    /// `--rule PATH=RULE`: the user's rules for paths of apps volprep does not know (app-safe),
    /// sorted by path, one per path.
    pub rules: Vec<PathRule>,
}

/// A user's rule for the mode of one entry (`--rule PATH=RULE`, with `--modes app-safe`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// `owner-only`: an entry the app owns loses every group and other bit (directories 0700,
    /// files 0600, from the usual modes); another uid's gets the kubelet's bits.
    OwnerOnly,
    /// An exact mode (`0755`, `2750`: permission and special bits), whoever owns the entry.
    Mode(u32),
    /// `keep`: the mode is left as it is; the group (and owner) still change.
    Keep,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::OwnerOnly => f.write_str("owner-only"),
            Rule::Mode(m) => write!(f, "{m:04o}"),
            Rule::Keep => f.write_str("keep"),
        }
    }
}

impl std::str::FromStr for Rule {
    type Err = String;

    fn from_str(s: &str) -> Result<Rule, String> {
        match s.trim() {
            "owner-only" => Ok(Rule::OwnerOnly),
            "keep" => Ok(Rule::Keep),
            m if (3..=4).contains(&m.len()) && m.bytes().all(|b| (b'0'..=b'7').contains(&b)) => {
                Ok(Rule::Mode(u32::from_str_radix(m, 8).map_err(|e| e.to_string())?))
            }
            other => Err(format!("'{other}' is not a rule: owner-only, keep, or an octal mode like 0755")),
        }
    }
}

/// A rule for the entry at `path`, relative to the volume root (empty: the root itself).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PathRule {
    pub path: std::path::PathBuf,
    pub rule: Rule,
}

impl PathRule {
    /// Parses `PATH=RULE`: PATH relative to the volume (`.` is its root), without `..`.
    pub fn parse(s: &str) -> Result<PathRule, String> {
        use std::path::Component;
        let (path, rule) = s.rsplit_once('=').ok_or_else(|| format!("'{s}' is not PATH=RULE"))?;
        let rule = rule.parse()?;
        let mut clean = std::path::PathBuf::new();
        for c in std::path::Path::new(path.trim()).components() {
            match c {
                Component::Normal(n) => clean.push(n),
                Component::CurDir => {}
                _ => return Err(format!("rule path '{path}': relative to the volume, without '..'")),
            }
        }
        Ok(PathRule { path: clean, rule })
    }

    /// `PATH=RULE`, the root as `.`.
    pub fn text(&self) -> String {
        let p = self.path.to_string_lossy();
        format!("{}={}", if p.is_empty() { "." } else { &p }, self.rule)
    }
}

/// Sorts `rules` by path and refuses two for one path.
pub fn rules_in_order(mut rules: Vec<PathRule>) -> Result<Vec<PathRule>, String> {
    rules.sort();
    if let Some(w) = rules.windows(2).find(|w| w[0].path == w[1].path) {
        return Err(format!("two rules for '{}': {} and {}", w[0].path.display(), w[0].rule, w[1].rule));
    }
    Ok(rules)
}

impl Spec {
    /// `--fs-group GID`: the group, with the kubelet's mode policy for read-write volumes.
    pub fn group(gid: u32) -> Spec {
        Spec { fs_group: Some(gid), ..Spec::default() }
    }

    /// `--owner UID[:GID]` alone: the owner (and group), modes untouched.
    pub fn owner(uid: u32, gid: Option<u32>) -> Spec {
        Spec { owner_uid: Some(uid), owner_gid: gid, ..Spec::default() }
    }

    /// The group every entry must have, if any.
    pub fn gid(&self) -> Option<u32> {
        self.fs_group.or(self.owner_gid)
    }

    /// The owner every entry must have, if any.
    pub fn uid(&self) -> Option<u32> {
        self.owner_uid
    }

    /// The uid the app runs as, if known: `--app-uid`, else the `--owner` uid (the app's, as
    /// the restored volume needs it). App-safe keeps private modes and tightens app paths only
    /// on entries this uid owns; without it, it gives every entry the kubelet's bits.
    pub fn app(&self) -> Option<u32> {
        self.app_uid.or(self.owner_uid)
    }

    /// Which of an entry's owner and group this spec sets: what a summary says it changed.
    pub fn ownership(&self) -> Ownership {
        match (self.uid(), self.gid()) {
            (Some(_), Some(_)) => Ownership::OwnerAndGroup,
            (Some(_), None) => Ownership::Owner,
            (None, _) => Ownership::Group,
        }
    }

    /// The permission bits an entry of `kind` must have (ORed into its mode; a directory's
    /// add search and setgid), or `None` when the spec does not touch modes (`--owner` alone).
    /// Symlinks have no mode of their own: callers never ask for theirs.
    pub fn mode_mask(&self, kind: Kind) -> Option<u32> {
        self.fs_group?;
        let base = self.access.mask();
        Some(if kind == Kind::Dir { base | EXEC_MASK | libc::S_ISGID } else { base })
    }

    /// True when the spec asks for nothing.
    pub fn is_empty(&self) -> bool {
        self.gid().is_none() && self.uid().is_none()
    }

    /// The canonical text the digest is computed from. Any field that changes the
    /// desired state appears here; the format version prefix changes if the rules do. The
    /// kubelet's mode rule adds nothing (markers written before `--modes` existed stay valid);
    /// app-safe adds ` modes=app-safe app-uid=UID` (`-` when the app's uid is not known), as
    /// what it keeps private depends on whose the entries are.
    pub fn canonical(&self) -> String {
        fn opt(v: Option<u32>) -> String {
            v.map_or_else(|| "-".to_string(), |v| v.to_string())
        }
        let modes = match self.modes {
            Modes::Kubelet => String::new(),
            m => format!(" modes={m} app-uid={}{}", opt(self.app()), self.rules_words(" rules=")),
        };
        format!(
            "volprep-spec/1 gid={} uid={} file_mask={} dir_mask={}{modes}",
            opt(self.gid()),
            opt(self.uid()),
            self.mode_mask(Kind::File).map_or_else(|| "-".into(), |m| format!("{m:o}")),
            self.mode_mask(Kind::Dir).map_or_else(|| "-".into(), |m| format!("{m:o}")),
        )
    }

    /// `PREFIX` and the rules as `PATH=RULE` separated by `;` (nothing without rules), paths
    /// escaped.
    fn rules_words(&self, prefix: &str) -> String {
        if self.rules.is_empty() {
            return String::new();
        }
        let words: Vec<String> = self.rules.iter().map(|r| escape_bytes(r.text().as_bytes())).collect();
        format!("{prefix}{}", words.join(";"))
    }

    /// The spec as `apply` flags (`--fs-group=2000 --owner=1001:2000 --read-only`): what a log
    /// line tells an operator to run.
    pub fn to_args(&self) -> Vec<String> {
        let Spec { fs_group, owner_uid, owner_gid, access, modes, app_uid, rules } = self;
        let mut args = Vec::new();
        if let Some(g) = fs_group {
            args.push(format!("--fs-group={g}"));
        }
        match (owner_uid, owner_gid) {
            (Some(u), Some(g)) => args.push(format!("--owner={u}:{g}")),
            (Some(u), None) => args.push(format!("--owner={u}")),
            _ => {}
        }
        if *access == Access::ReadOnly {
            args.push("--read-only".into());
        }
        if *modes != Modes::Kubelet {
            args.push(format!("--modes={modes}"));
        }
        if let (Modes::AppSafe, Some(u)) = (modes, app_uid) {
            args.push(format!("--app-uid={u}"));
        }
        args.extend(rules.iter().map(|r| format!("--rule={}", r.text())));
        args
    }

    /// A stable digest of the desired state: 16 hex digits of SHA-256 over [`Spec::canonical`].
    pub fn digest(&self) -> Digest {
        Digest(hex16(&self.canonical()))
    }

    /// The digest a marker keeps: the spec's, plus what the pass covers. With `--cross-devices`
    /// a pass covers nested mounts too, so a marker of a pass without it must not let one with
    /// it skip. Without it this is [`Spec::digest`], so existing markers stay valid.
    pub fn coverage_digest(&self, cross_devices: bool) -> Digest {
        if cross_devices { Digest(hex16(&format!("{} cross-devices", self.canonical()))) } else { self.digest() }
    }

    /// The spec in words with what the pass covers (`fs-group=2000 cross-devices`).
    pub fn coverage_text(&self, cross_devices: bool) -> String {
        if cross_devices { format!("{self} cross-devices") } else { self.to_string() }
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(g) = self.fs_group {
            parts.push(format!("fs-group={g}"));
        }
        match (self.owner_uid, self.owner_gid) {
            (Some(u), Some(g)) => parts.push(format!("owner={u}:{g}")),
            (Some(u), None) => parts.push(format!("owner={u}")),
            _ => {}
        }
        if self.access == Access::ReadOnly {
            parts.push("read-only".into());
        }
        if self.modes != Modes::Kubelet {
            parts.push(format!("modes={}", self.modes));
        }
        if let (Modes::AppSafe, Some(u)) = (self.modes, self.app_uid) {
            parts.push(format!("app-uid={u}"));
        }
        parts.extend(self.rules.iter().map(|r| format!("rule={}", escape_bytes(r.text().as_bytes()))));
        f.write_str(&parts.join(" "))
    }
}

/// Which of an entry's owner and group a spec sets (`changed_owner` counts an entry whose owner or
/// group changed): the word a summary uses for that count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// `--fs-group` alone: the group only.
    Group,
    /// `--owner UID` alone: the owner only.
    Owner,
    /// `--owner UID:GID`, or `--owner UID` with `--fs-group`.
    OwnerAndGroup,
}

impl Ownership {
    /// What the spec words a report keeps (`Spec`'s `Display`, maybe with ` cross-devices`)
    /// set; `None` for words no spec writes (a report edited by hand, `sticky`).
    pub fn of_words(words: &str) -> Option<Ownership> {
        let (mut group, mut owner) = (false, None);
        for word in words.split(' ') {
            match word.split_once('=') {
                Some(("fs-group", _)) => group = true,
                Some(("owner", id)) => owner = Some(id.contains(':')),
                Some(("modes" | "app-uid" | "rule", _)) => {}
                None if matches!(word, "read-only" | "cross-devices") => {}
                _ => return None,
            }
        }
        match owner {
            Some(with_gid) if with_gid || group => Some(Ownership::OwnerAndGroup),
            Some(_) => Some(Ownership::Owner),
            None if group => Some(Ownership::Group),
            None => None,
        }
    }
}

impl fmt::Display for Ownership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Ownership::Group => "group",
            Ownership::Owner => "owner",
            Ownership::OwnerAndGroup => "owner and group",
        })
    }
}

/// The digest of a spec and of what a pass covers ([`Spec::coverage_digest`]): what a marker, a
/// checkpoint and a report record, and what runs compare. Computed, it is 16 hex digits; read
/// back from the root it is whatever the app wrote there, which is only ever compared (it never
/// matches a computed one) and shown through `Display`, which escapes it. On the wire it is the
/// plain string.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Digest(String);

impl Digest {
    /// The digest as it was computed or read: for logs and reports of a computed one.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&escape_bytes(self.0.as_bytes()))
    }
}

/// Tests name digests by hand (`"d1"`).
#[cfg(test)]
impl From<&str> for Digest {
    fn from(s: &str) -> Self {
        Digest(s.into())
    }
}

/// 16 hex digits of SHA-256 over `text`.
fn hex16(text: &str) -> String {
    let hash = Sha256::digest(text.as_bytes());
    hash[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses a uid or gid: a decimal number below 4294967295 (which means "-1", no change).
pub fn parse_id(s: &str) -> Result<u32, String> {
    if s.trim() == "-1" {
        return Err("-1 means \"no change\", not an id".into());
    }
    let v: u32 = s.trim().parse().map_err(|_| format!("'{s}' is not a numeric id (0..4294967294)"))?;
    if v == u32::MAX {
        return Err(format!("'{s}' is -1 (\"no change\"), not an id"));
    }
    Ok(v)
}

/// Parses `UID` or `UID:GID`.
pub fn parse_owner(s: &str) -> Result<(u32, Option<u32>), String> {
    match s.split_once(':') {
        Some((u, g)) => Ok((parse_id(u)?, Some(parse_id(g)?))),
        None => Ok((parse_id(s)?, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_follow_the_kubelet() {
        assert_eq!(Spec::group(1).mode_mask(Kind::File), Some(0o660));
        assert_eq!(Spec::group(1).mode_mask(Kind::Dir), Some(0o2770));
        let ro = Spec { access: Access::ReadOnly, ..Spec::group(1) };
        assert_eq!(ro.mode_mask(Kind::File), Some(0o440));
        assert_eq!(ro.mode_mask(Kind::Dir), Some(0o2550));
        let owner = Spec::owner(5, Some(6));
        assert_eq!(owner.mode_mask(Kind::Dir), None);
        assert_eq!(owner.gid(), Some(6));
    }

    #[test]
    fn fs_group_wins_over_owner_gid() {
        let s = Spec { owner_uid: Some(1001), owner_gid: Some(7), ..Spec::group(2000) };
        assert_eq!(s.gid(), Some(2000));
        assert_eq!(s.uid(), Some(1001));
    }

    #[test]
    fn digest_is_stable_and_sensitive() {
        // Pinned: a change of this value invalidates every marker in the field.
        assert_eq!(Spec::group(2000).digest().as_str(), "5a8810073d7c0a3d");
        assert_eq!(Spec::group(2000).digest(), Spec::group(2000).digest());
        assert_eq!(Spec::group(2000).digest().as_str().len(), 16);
        assert_ne!(Spec::group(2000).digest(), Spec::group(1000).digest());
        assert_ne!(Spec::group(2000).digest(), Spec { access: Access::ReadOnly, ..Spec::group(2000) }.digest());
        assert_ne!(Spec::group(2000).digest(), Spec { owner_uid: Some(1), ..Spec::group(2000) }.digest());
        // --owner U:G and --fs-group G with --owner U differ (modes).
        let o = Spec::owner(1, Some(2000));
        assert_ne!(o.digest(), Spec { owner_uid: Some(1), ..Spec::group(2000) }.digest());
        // The owner gid is irrelevant when fs-group sets the group.
        assert_eq!(
            Spec { owner_uid: Some(1), owner_gid: Some(5), ..Spec::group(2000) }.digest(),
            Spec { owner_uid: Some(1), owner_gid: None, ..Spec::group(2000) }.digest()
        );
    }

    #[test]
    fn a_digest_travels_as_its_text_and_shows_escaped() {
        let d = Spec::group(2000).digest();
        assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{}\"", d.as_str()));
        assert_eq!(d.to_string(), d.as_str(), "a computed digest shows as it is");
        // One read back from the root is whatever the app wrote: never equal, shown escaped.
        let forged: Digest = serde_json::from_str(r#""d\n\u2028x""#).unwrap();
        assert_ne!(forged, d);
        assert_eq!(forged.to_string(), r"d\n\u{2028}x");
        let back: String = serde_json::from_str(&serde_json::to_string(&forged).unwrap()).unwrap();
        assert_eq!(back, "d\n\u{2028}x", "kept as read");
    }

    #[test]
    fn the_mode_policy_is_in_the_digest_and_kubelet_adds_nothing() {
        let kubelet = Spec::group(2000);
        let safe = Spec { modes: Modes::AppSafe, ..Spec::group(2000) };
        // Pinned: the kubelet's rule keeps the digest of every marker written before --modes.
        assert_eq!(kubelet.canonical(), "volprep-spec/1 gid=2000 uid=- file_mask=660 dir_mask=2770");
        assert_eq!(
            safe.canonical(),
            "volprep-spec/1 gid=2000 uid=- file_mask=660 dir_mask=2770 modes=app-safe app-uid=-"
        );
        assert_ne!(kubelet.digest(), safe.digest(), "switching the policy walks again");
        // The app's uid decides what app-safe keeps private: it is in the digest too, from
        // --app-uid or else --owner; the kubelet's rule ignores it.
        let app = Spec { app_uid: Some(2000), ..safe.clone() };
        assert!(app.canonical().ends_with(" modes=app-safe app-uid=2000"), "{}", app.canonical());
        assert_ne!(app.digest(), safe.digest());
        assert_ne!(app.digest(), Spec { app_uid: Some(2001), ..safe.clone() }.digest());
        let by_owner = Spec { owner_uid: Some(2000), ..safe.clone() };
        assert!(by_owner.canonical().ends_with(" app-uid=2000"), "--owner names the app");
        assert_eq!(Spec { app_uid: Some(2000), ..kubelet.clone() }.digest(), kubelet.digest());
        assert_eq!(app.to_string(), "fs-group=2000 modes=app-safe app-uid=2000");
        assert_ne!(safe.coverage_digest(true), kubelet.coverage_digest(true));
        let owner_safe = Spec { modes: Modes::AppSafe, ..Spec::owner(5, Some(5)) };
        assert_ne!(owner_safe.digest(), Spec::owner(5, Some(5)).digest());
        assert_eq!(safe.to_string(), "fs-group=2000 modes=app-safe");
        assert_eq!(kubelet.to_string(), "fs-group=2000");
    }

    #[test]
    fn rules_parse_and_are_in_the_digest() {
        let r = |s: &str| PathRule::parse(s);
        assert_eq!(r("conf/tls.key=owner-only").unwrap().rule, Rule::OwnerOnly);
        assert_eq!(r("./chroot/=0755").unwrap(), PathRule { path: "chroot".into(), rule: Rule::Mode(0o755) });
        assert_eq!(r(".=keep").unwrap(), PathRule { path: "".into(), rule: Rule::Keep });
        assert_eq!(r("a=b=2750").unwrap(), PathRule { path: "a=b".into(), rule: Rule::Mode(0o2750) });
        assert_eq!(r(".=keep").unwrap().text(), ".=keep");
        for bad in ["x", "x=0999", "x=77", "x=17777", "x=private", "/etc=0600", "a/../b=keep"] {
            assert!(r(bad).is_err(), "{bad}");
        }
        let two = vec![r("a=keep").unwrap(), r("./a=0700").unwrap()];
        assert!(rules_in_order(two).unwrap_err().contains("two rules for 'a'"));
        let safe = Spec { modes: Modes::AppSafe, app_uid: Some(7), ..Spec::group(2000) };
        let ruled = Spec { rules: vec![r("k=owner-only").unwrap()], ..safe.clone() };
        assert!(ruled.canonical().ends_with(" app-uid=7 rules=k=owner-only"), "{}", ruled.canonical());
        assert_ne!(ruled.digest(), safe.digest());
        assert_eq!(ruled.to_string(), "fs-group=2000 modes=app-safe app-uid=7 rule=k=owner-only");
        assert_eq!(ruled.to_args().last().unwrap(), "--rule=k=owner-only");
    }

    #[test]
    fn mode_policies_parse_from_their_words() {
        for m in Modes::ALL {
            assert_eq!(m.word().parse::<Modes>(), Ok(m));
        }
        assert_eq!("App-Safe".parse::<Modes>(), Ok(Modes::AppSafe));
        assert!("appsafe".parse::<Modes>().unwrap_err().contains("kubelet or app-safe"));
        assert!("".parse::<Modes>().is_err());
    }

    #[test]
    fn cross_devices_changes_the_coverage_digest_only() {
        assert_eq!(
            Spec::group(2000).coverage_digest(false),
            Spec::group(2000).digest(),
            "markers of passes without it stay valid"
        );
        assert_ne!(Spec::group(2000).coverage_digest(true), Spec::group(2000).digest());
        assert_ne!(Spec::group(2000).coverage_digest(true), Spec::group(1000).coverage_digest(true));
        assert_eq!(Spec::group(2000).coverage_text(true), "fs-group=2000 cross-devices");
    }

    #[test]
    fn ownership_names_what_the_spec_sets_and_reads_back_from_its_words() {
        let specs = [
            (Spec::group(2000), Ownership::Group),
            (Spec { access: Access::ReadOnly, ..Spec::group(2000) }, Ownership::Group),
            (Spec::owner(1000, None), Ownership::Owner),
            (Spec::owner(1000, Some(2000)), Ownership::OwnerAndGroup),
            (Spec { owner_uid: Some(1000), ..Spec::group(2000) }, Ownership::OwnerAndGroup),
            (
                Spec { owner_uid: Some(1000), owner_gid: Some(5), access: Access::ReadOnly, ..Spec::group(2000) },
                Ownership::OwnerAndGroup,
            ),
            (Spec { modes: Modes::AppSafe, ..Spec::group(2000) }, Ownership::Group),
            (Spec { modes: Modes::AppSafe, app_uid: Some(7), ..Spec::group(2000) }, Ownership::Group),
        ];
        for (spec, want) in specs {
            assert_eq!(spec.ownership(), want, "{spec}");
            assert_eq!(Ownership::of_words(&spec.to_string()), Some(want), "{spec}");
            assert_eq!(Ownership::of_words(&spec.coverage_text(true)), Some(want), "{spec}");
        }
        for words in ["sticky", "", "read-only", "fs-group=1 colour=red"] {
            assert_eq!(Ownership::of_words(words), None, "{words:?}");
        }
        assert_eq!(Ownership::OwnerAndGroup.to_string(), "owner and group");
    }

    #[test]
    fn to_args_are_the_words_as_flags() {
        for spec in [
            Spec::group(2000),
            Spec { access: Access::ReadOnly, ..Spec::group(2000) },
            Spec::owner(1001, None),
            Spec::owner(1001, Some(2000)),
            Spec { owner_uid: Some(1), owner_gid: Some(5), access: Access::ReadOnly, ..Spec::group(2000) },
            Spec { modes: Modes::AppSafe, ..Spec::group(2000) },
            Spec { modes: Modes::AppSafe, app_uid: Some(7), ..Spec::group(2000) },
        ] {
            let words: Vec<String> = spec.to_string().split(' ').map(|w| format!("--{w}")).collect();
            assert_eq!(spec.to_args(), words, "{spec}");
        }
        assert_eq!(Spec::owner(1, Some(2)).to_args(), ["--owner=1:2"]);
    }

    #[test]
    fn ids_reject_minus_one_and_words() {
        assert_eq!(parse_id("2000"), Ok(2000));
        assert!(parse_id("4294967295").is_err());
        assert!(parse_id("-1").is_err());
        assert!(parse_id("abc").is_err());
        assert!(parse_id("").is_err());
        assert_eq!(parse_owner("1001:2000"), Ok((1001, Some(2000))));
        assert_eq!(parse_owner("1001"), Ok((1001, None)));
        assert!(parse_owner("1001:").is_err());
    }
}
