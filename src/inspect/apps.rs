//! The app-private paths `inspect` finds (PostgreSQL's data directory, `.ssh`, Erlang's cookie
//! ...): what the kubelet's rule, `--modes app-safe` and the spec asked about leave on each, and
//! whether its app accepts that.

use serde::Serialize;

use crate::apps::{self, AppPath, Links, Private, Stance, Whose};
use crate::escape::EscapedPath;
use crate::spec::{Modes, Spec};
use crate::sys::Meta;

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
    /// After `volprep apply` with the spec `inspect` was given (`--owner`, `--fs-group`,
    /// `--modes`), when it was given one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub with_spec: Option<Outcome>,
}

/// A mode and what the app does with it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Outcome {
    pub mode: String,
    /// `accepts`, `refuses`, `warns`, or `exposes` (it does not look, and the group can read
    /// what it keeps private).
    pub app: &'static str,
    /// The app's message, when it refuses or warns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<&'static str>,
}

impl Outcome {
    /// What `path`'s app does with permission bits `perm`.
    fn of(path: AppPath, perm: u32) -> Outcome {
        let mode = format!("{perm:04o}");
        if path.accepts(perm) {
            return Outcome { mode, app: "accepts", message: None };
        }
        match path.stance() {
            Stance::Refuses(m) => Outcome { mode, app: "refuses", message: Some(m) },
            Stance::Warns(m) => Outcome { mode, app: "warns", message: Some(m) },
            Stance::Exposes => Outcome { mode, app: "exposes", message: None },
        }
    }

    /// `2770 (refuses)`.
    pub fn short(&self) -> String {
        format!("{} ({})", self.mode, self.app)
    }

    pub fn accepted(&self) -> bool {
        self.app == "accepts"
    }
}

impl AppPathView {
    /// The view of the entry `meta` at `private`, relative path `path`. `mask`: the kubelet's
    /// bits for it (`policy`'s); `spec`: what `inspect` was asked about, if anything.
    pub fn of(path: EscapedPath, meta: &Meta, private: Private, policy: &Spec, spec: Option<&Spec>) -> AppPathView {
        let perm = meta.perm();
        let mask = policy.mode_mask(meta.kind());
        let links = Links::of(meta.kind(), meta.nlink);
        let whose = |s: &Spec| Whose { owner: s.uid().unwrap_or(meta.uid), app: s.app() };
        let after = |s: &Spec, modes: Modes| {
            let m = s.mode_mask(meta.kind()).or(mask);
            apps::want_mode(modes, perm, m, Some(private), whose(s), links).unwrap_or(perm)
        };
        let safe_spec = spec.unwrap_or(policy);
        AppPathView {
            path,
            app: private.path.to_string(),
            uid: meta.uid,
            mode: format!("{perm:04o}"),
            wants: private.path.wants().to_string(),
            kubelet: Outcome::of(private.path, mask.map_or(perm, |m| perm | m)),
            app_safe: Outcome::of(private.path, after(safe_spec, Modes::AppSafe)),
            with_spec: spec.map(|s| {
                let mode = apps::want_mode(s.modes, perm, s.mode_mask(meta.kind()), Some(private), whose(s), links);
                Outcome::of(private.path, mode.unwrap_or(perm))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        assert_eq!((v.kubelet.mode.as_str(), v.kubelet.app), ("2770", "refuses"));
        assert_eq!(v.app_safe.short(), "2750 (accepts)");
        let with = v.with_spec.unwrap();
        assert_eq!(with.short(), "2770 (refuses)", "--owner alone leaves the widened mode");
        assert!(with.message.unwrap().contains("invalid permissions"));
    }

    #[test]
    fn a_private_directory_is_fine_until_the_kubelet_widens_it() {
        let unknown = Spec::group(2000);
        let v = AppPathView::of(EscapedPath::relative("pgdata".as_ref()), &dir(0o700, 2000), PG, &unknown, None);
        assert_eq!(v.app_safe.short(), "2770 (refuses)", "the app's uid not known: the kubelet's rule");
        let policy = Spec { app_uid: Some(2000), ..Spec::group(2000) };
        let v = AppPathView::of(EscapedPath::relative("pgdata".as_ref()), &dir(0o700, 2000), PG, &policy, None);
        assert_eq!(v.mode, "0700");
        assert_eq!(v.kubelet.short(), "2770 (refuses)");
        assert_eq!(v.app_safe.short(), "0700 (accepts)");
        assert!(v.with_spec.is_none());
        let safe = Spec { modes: Modes::AppSafe, ..policy };
        let v = AppPathView::of(EscapedPath::relative("pgdata".as_ref()), &dir(0o700, 2000), PG, &safe, Some(&safe));
        assert_eq!(v.with_spec.unwrap().short(), "0700 (accepts)");
    }
}
