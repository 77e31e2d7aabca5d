//! The app-private paths `inspect` finds (PostgreSQL's data directory, `.ssh`, Erlang's cookie
//! ...): what the kubelet's rule, `--modes app-safe` and the spec asked about leave on each, and
//! whether its app accepts that.

use serde::Serialize;

use crate::apps::{self, AppPath, Links, Private, Stance, Whose};
use crate::escape::EscapedPath;
use crate::spec::{Modes, Spec};
use crate::sys::{Kind, Meta};

/// One app path and what each setting leaves on it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct AppPathView {
    /// Relative to the volume root (`.` is the root).
    pub path: EscapedPath,
    /// What it is (`PostgreSQL data directory`).
    pub app: String,
    /// Its owner and permission bits now.
    pub uid: u32,
    pub mode: String,
    /// The modes its app accepts, in words.
    pub wants: String,
    /// After the kubelet's rule (`old | mask`).
    pub kubelet: Outcome,
    /// After `volprep apply --modes app-safe` (with the spec's owner, if any).
    pub app_safe: Outcome,
    /// The app's uid `app_safe` is judged for when none was given (`--app-uid`, `--owner`):
    /// the entry's owner, as `--app-uid` would have to say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub assumed_app_uid: Option<u32>,
    /// After `volprep apply` with the spec `inspect` was given (`--owner`, `--fs-group`,
    /// `--modes`), when it was given one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub with_spec: Option<Outcome>,
}

/// A mode and what the app does with it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Outcome {
    pub mode: String,
    pub app: Verdict,
    /// The app's message, when it refuses or warns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<&'static str>,
}

/// What an app does with a mode, spelt as a word only in JSON and tables. In the order of
/// those words (the order `inspect` lists its findings in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Verdict {
    #[serde(rename = "accepts")]
    Accepts,
    /// The app's uid, with the group, cannot open the entry.
    #[serde(rename = "cannot open")]
    CannotOpen,
    /// It does not look, and the group can read what it keeps private.
    #[serde(rename = "exposes")]
    Exposes,
    #[serde(rename = "refuses")]
    Refuses,
    #[serde(rename = "warns")]
    Warns,
}

impl Verdict {
    /// `accepts`, `cannot open`, `exposes`, `refuses`, `warns`.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Accepts => "accepts",
            Verdict::CannotOpen => "cannot open",
            Verdict::Exposes => "exposes",
            Verdict::Refuses => "refuses",
            Verdict::Warns => "warns",
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.word())
    }
}

impl Outcome {
    /// What `path`'s app does with permission bits `perm`, when it can open the entry at all.
    fn of(path: AppPath, perm: u32, reach: Reach) -> Outcome {
        let mode = format!("{perm:04o}");
        if reach == Reach::CannotOpen {
            return Outcome {
                mode,
                app: Verdict::CannotOpen,
                message: Some("the app's uid cannot open it: not its owner, and its group lacks the bits"),
            };
        }
        if path.accepts(perm) {
            return Outcome { mode, app: Verdict::Accepts, message: None };
        }
        match path.stance() {
            Stance::Refuses(m) => Outcome { mode, app: Verdict::Refuses, message: Some(m) },
            Stance::Warns(m) => Outcome { mode, app: Verdict::Warns, message: Some(m) },
            Stance::Exposes => Outcome { mode, app: Verdict::Exposes, message: None },
        }
    }

    /// `2770 (refuses)`.
    pub fn short(&self) -> String {
        format!("{} ({})", self.mode, self.app)
    }

    pub fn accepted(&self) -> bool {
        self.app == Verdict::Accepts
    }
}

/// Who the app is, for reach: its uid and the group it is given (the fsGroup); `None`: not
/// known (every entry counts as reachable).
#[derive(Debug, Clone, Copy)]
pub struct App {
    pub uid: Option<u32>,
    pub group: Option<u32>,
}

impl App {
    /// Whether the app opens an entry of `kind` (a directory: lists and enters it; else reads
    /// it) owned by `owner`:`gid` with permission bits `perm`, as the kernel decides (root:
    /// always).
    pub fn reach(self, kind: Kind, perm: u32, owner: u32, gid: u32) -> Reach {
        let Some(uid) = self.uid else { return Reach::Opens };
        let need = if kind == Kind::Dir { 0o5 } else { 0o4 };
        let bits = if uid == 0 {
            return Reach::Opens;
        } else if uid == owner {
            perm >> 6
        } else if self.group == Some(gid) {
            perm >> 3
        } else {
            perm
        };
        if bits & need == need { Reach::Opens } else { Reach::CannotOpen }
    }
}

/// Whether the app's uid can open an entry ([`App::reach`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    Opens,
    CannotOpen,
}

impl AppPathView {
    /// The view of the entry `meta` at `private`, relative path `path`. `mask`: the kubelet's
    /// bits for it (`policy`'s); `spec`: what `inspect` was asked about, if anything.
    pub fn of(path: EscapedPath, meta: &Meta, private: Private, policy: &Spec, spec: Option<&Spec>) -> AppPathView {
        let perm = meta.perm();
        let mask = policy.mode_mask(meta.kind());
        let links = Links::of(meta.kind(), meta.nlink);
        let safe_spec = spec.unwrap_or(policy);
        let given = safe_spec.app();
        let owner_of = |s: &Spec| s.uid().unwrap_or(meta.uid);
        // The app's group: the pod's fsGroup (a supplementary group of the app).
        let app = App { uid: given.or(Some(owner_of(safe_spec))), group: safe_spec.fs_group.or(policy.fs_group) };
        let outcome = |s: &Spec, mode: u32| {
            let reach = app.reach(meta.kind(), mode, owner_of(s), s.gid().unwrap_or(meta.gid));
            Outcome::of(private.path, mode, reach)
        };
        let safe = {
            let whose = Whose { owner: owner_of(safe_spec), app: given.or(Some(owner_of(safe_spec))) };
            let m = safe_spec.mode_mask(meta.kind()).or(mask);
            apps::want_mode(Modes::AppSafe, perm, m, Some(private), whose, links).unwrap_or(perm)
        };
        let kubelet = Spec { owner_uid: None, ..policy.clone() };
        AppPathView {
            path,
            app: private.path.to_string(),
            uid: meta.uid,
            mode: format!("{perm:04o}"),
            wants: private.path.wants().to_string(),
            kubelet: outcome(&kubelet, mask.map_or(perm, |m| perm | m)),
            app_safe: outcome(safe_spec, safe),
            assumed_app_uid: given.is_none().then(|| owner_of(safe_spec)),
            with_spec: spec.map(|s| {
                let whose = Whose { owner: owner_of(s), app: s.app() };
                let mode = apps::want_mode(s.modes, perm, s.mode_mask(meta.kind()), Some(private), whose, links);
                outcome(s, mode.unwrap_or(perm))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_sort_and_are_written_as_their_words() {
        let all = [Verdict::Accepts, Verdict::CannotOpen, Verdict::Exposes, Verdict::Refuses, Verdict::Warns];
        for v in all {
            assert_eq!(serde_json::to_string(&v).unwrap(), format!("\"{v}\""));
        }
        assert!(all.windows(2).all(|w| w[0] < w[1] && w[0].word() < w[1].word()), "in the order of the words");
    }
    use crate::apps::Anchor;

    fn dir(perm: u32, uid: u32) -> Meta {
        Meta { dev: 1, ino: 2, mode: libc::S_IFDIR | perm, uid, gid: 4000, nlink: 2, mnt_id: 0 }
    }

    const PG: Private = Private { path: AppPath::PostgresData, anchor: Anchor::Itself };

    #[test]
    fn a_data_directory_the_kubelet_walked_stays_refused_under_owner_alone() {
        let policy = Spec::group(0);
        let owner = Spec::owner(2000, Some(2000));
        let v =
            AppPathView::of(EscapedPath::relative("pgdata".as_ref()), &dir(0o2770, 2000), PG, &policy, Some(&owner));
        assert_eq!((v.kubelet.mode.as_str(), v.kubelet.app), ("2770", Verdict::Refuses));
        assert_eq!(v.app_safe.short(), "2750 (accepts)");
        let with = v.with_spec.unwrap();
        assert_eq!(with.short(), "2770 (refuses)", "--owner alone leaves the widened mode");
        assert!(with.message.unwrap().contains("invalid permissions"));
    }

    #[test]
    fn a_private_directory_is_fine_until_the_kubelet_widens_it() {
        let unknown = Spec::group(2000);
        let v = AppPathView::of(EscapedPath::relative("pgdata".as_ref()), &dir(0o700, 2000), PG, &unknown, None);
        assert_eq!(v.app_safe.short(), "0700 (accepts)", "the app's uid not known: judged for the owner's");
        assert_eq!(v.assumed_app_uid, Some(2000), "which --app-uid must say");
        let policy = Spec { app_uid: Some(2000), ..Spec::group(2000) };
        let v = AppPathView::of(EscapedPath::relative("pgdata".as_ref()), &dir(0o700, 2000), PG, &policy, None);
        assert_eq!(v.mode, "0700");
        assert_eq!(v.kubelet.short(), "2770 (refuses)");
        assert_eq!(v.app_safe.short(), "0700 (accepts)");
        assert!(v.with_spec.is_none());
        let safe = Spec { modes: Modes::AppSafe, ..policy };
        let v = AppPathView::of(EscapedPath::relative("pgdata".as_ref()), &dir(0o700, 2000), PG, &safe, Some(&safe));
        assert_eq!(v.with_spec.unwrap().short(), "0700 (accepts)");
        assert_eq!(v.assumed_app_uid, None);
    }

    /// Never "(accepts)" of a path the app cannot open: restored as uid 3000, the app (2000)
    /// is locked out of a 0700 directory whatever its mode bits say.
    #[test]
    fn a_path_the_app_cannot_open_is_said_so() {
        let restored = dir(0o700, 3000);
        let owner_alone = Spec { app_uid: Some(2000), modes: Modes::AppSafe, ..Spec::owner(3000, Some(3000)) };
        let v = AppPathView::of(
            EscapedPath::relative("pgdata".as_ref()),
            &restored,
            PG,
            &Spec::group(0),
            Some(&owner_alone),
        );
        assert_eq!(v.with_spec.unwrap().short(), "0700 (cannot open)");
        assert!(v.app_safe.short().ends_with("(cannot open)"), "{:?}", v.app_safe);
        // With the fsGroup the app gets in through the group (and PostgreSQL then refuses 2770).
        let safe = Spec { modes: Modes::AppSafe, app_uid: Some(2000), ..Spec::group(2000) };
        let v = AppPathView::of(EscapedPath::relative("pgdata".as_ref()), &restored, PG, &safe, Some(&safe));
        assert_eq!(v.with_spec.unwrap().short(), "2770 (refuses)");
        // The app's own: accepted.
        let v = AppPathView::of(EscapedPath::relative("pgdata".as_ref()), &dir(0o700, 2000), PG, &safe, Some(&safe));
        assert_eq!(v.with_spec.unwrap().short(), "0700 (accepts)");
    }
}
