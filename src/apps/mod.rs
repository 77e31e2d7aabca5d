//! App-private paths and the `--modes app-safe` rule (pure): which entries an app insists on
//! keeping private (PostgreSQL's data directory and key, ssh's home, `.ssh` and keys, Erlang's
//! cookie, GnuPG's and etcd's directories), recognised by their names and the names in their
//! directories, and the mode each policy gives an entry.

mod classify;
mod table;

use crate::spec::{Modes, Rule};
use crate::sys::Kind;

pub use classify::{DirFacts, ParentFacts, Signs, classify_dir, classify_file, looks_like_private_key};
use table::GROUP_OTHER;
#[cfg(test)]
use table::TABLE;
pub use table::{Anchor, AppPath, Private, Stance};

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
        let reference = include_str!("../../docs/reference.md");
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
