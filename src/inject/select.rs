//! Which pod templates `inject` rewrites, and how, decided without changing anything: a
//! [`Decision`] per object, from its pod spec and the configuration.

use std::collections::BTreeSet;

use super::config::{Config, Mode, Select};
use super::node::Node;
use super::volumes::{self, Class, Mount, containers, mounts_of, runs_as_root, user_of};
use crate::spec::{Modes, PathRule};

/// The annotation that opts a workload out (`"false"`) or, with `--opt-in`, in (`"true"`).
pub const ANNOTATION: &str = "volprep.io/inject";

/// The annotation that chooses a workload's mode policy (`kubelet` or `app-safe`), over the
/// `modes` key.
pub const MODES_ANNOTATION: &str = "volprep.io/modes";

/// The annotation that gives rules for paths of the volumes (`VOLUME/PATH=RULE`, separated by
/// spaces, `;` or newlines): each goes on that volume's `--volume` as `rule=PATH=RULE`, with
/// app-safe.
pub const RULES_ANNOTATION: &str = "volprep.io/rules";

/// What to do with one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Left as it is, and why (not a pod template, not selected, already injected).
    Skip(String),
    /// Left as it is because inject cannot read it the way Kubernetes does (YAML merge keys):
    /// said at info level.
    Unsupported(String),
    /// Left as it is because the rewrite would change what the app may read or do.
    Refuse(Vec<String>),
    Inject(Plan),
}

/// The rewrite of one pod template.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub fs_group: u64,
    pub volumes: Vec<Volume>,
    /// The uid and gid of the init container in mode unprivileged.
    pub run_as: Option<(u64, u64)>,
    /// The mode policy of its `--volume`s: the annotation's, else the `modes` key's; None when
    /// neither chose one.
    pub modes: Option<Modes>,
    /// The user's rules (`volprep.io/rules`), by volume name.
    pub rules: Vec<(String, PathRule)>,
    /// The apps of the table its containers run (by image) under the kubelet's rule: what
    /// inject says of it (`postgres:17 (PostgreSQL)`).
    pub apps: Vec<String>,
}

/// Images of apps that insist on private modes (by the image's name, its last path part
/// without tag), and the app.
const APP_IMAGES: [(&str, &str); 7] = [
    ("postgres", "PostgreSQL"),
    ("postgresql", "PostgreSQL"),
    ("postgis", "PostgreSQL"),
    ("rabbitmq", "RabbitMQ (Erlang cookie)"),
    ("etcd", "etcd"),
    ("openssh-server", "OpenSSH"),
    ("gitea", "OpenSSH"),
];

/// The apps of [`APP_IMAGES`] the containers mounting a walked volume run, unless the volumes
/// get app-safe: `IMAGE (APP)` each.
fn apps_under_kubelet(pod: &Node, volumes: &[Volume], modes: Option<Modes>, cfg: &Config) -> Vec<String> {
    let implied = super::rewrite::implied_modes(&cfg.apply.extra_args);
    if modes.or(implied) == Some(Modes::AppSafe) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for v in volumes.iter().filter(|v| v.prep == Prep::Walk) {
        for m in mounts_of(pod, &v.name) {
            let image = m.container.get("image").and_then(Node::as_str).unwrap_or("");
            let name = image.split('@').next().unwrap_or("").rsplit('/').next().unwrap_or("");
            let name = name.split(':').next().unwrap_or("");
            if let Some((_, app)) = APP_IMAGES.iter().find(|(n, _)| *n == name) {
                let said = format!("{image} ({app})");
                if !out.contains(&said) {
                    out.push(said);
                }
            }
        }
    }
    out
}

/// A volume the init container mounts at /volumes/NAME.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub prep: Prep,
    /// The uid the containers mounting it run as (`runAsUser`), when they all set the same
    /// non-root one: the app's uid `--modes app-safe` needs (`app-uid=`).
    pub app_uid: Option<u64>,
}

/// The rules of `volprep.io/rules` (on the pod template or the object, the template's winning):
/// `VOLUME/PATH=RULE` (`VOLUME=RULE`: its root). Err: the refusal.
fn rules_of(obj: &Node, path: &[&str]) -> Result<Vec<(String, PathRule)>, String> {
    let Some(v) = annotation(obj, path, RULES_ANNOTATION, Some) else { return Ok(Vec::new()) };
    let text = v.as_str().unwrap_or_default();
    let bad = |e: String| format!("annotation {RULES_ANNOTATION}: {e}");
    let mut out = Vec::new();
    for word in text.split([' ', ';', '\n', '\t']).filter(|w| !w.is_empty()) {
        let (volume, rule) = match word.split_once('/') {
            Some((v, rest)) if !v.contains('=') => (v, rest.to_string()),
            _ => {
                let (v, r) = word.split_once('=').ok_or_else(|| bad(format!("'{word}' is not VOLUME/PATH=RULE")))?;
                (v, format!(".={r}"))
            }
        };
        out.push((volume.to_string(), PathRule::parse(&rule).map_err(bad)?));
    }
    Ok(out)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prep {
    /// `--volume /volumes/NAME,fs-group=GID`: what the kubelet's fsGroup pass did. A volume
    /// the kubelet mounts read-only is never walked (its plugins skip it), so the spec is
    /// always the read-write one, whatever the containers' `readOnly` mounts say.
    Walk,
    /// `--sticky /volumes/NAME`: an emptyDir the app uses as its temp dir, made 01777.
    Sticky,
}

/// Where the pod spec of a kind is, from the object's root: the core kinds, Argo Rollouts'
/// `Rollout`, OpenKruise's `CloneSet` and OpenShift's `DeploymentConfig` (OpenKruise's
/// Advanced StatefulSet and DaemonSet share the core kinds' names and shapes).
pub fn pod_spec_path(kind: &str) -> Option<&'static [&'static str]> {
    Some(match kind {
        "Pod" => &["spec"],
        "Deployment"
        | "StatefulSet"
        | "DaemonSet"
        | "ReplicaSet"
        | "Job"
        | "ReplicationController"
        | "Rollout"
        | "CloneSet"
        | "DeploymentConfig" => &["spec", "template", "spec"],
        "CronJob" => &["spec", "jobTemplate", "spec", "template", "spec"],
        "PodTemplate" => &["template", "spec"],
        _ => return None,
    })
}

/// An annotation's value, as `read` reads it, on the pod template at `path` or on the object
/// (the template's wins).
fn annotation<'a, T>(obj: &'a Node, path: &[&str], name: &str, read: impl Fn(&'a Node) -> Option<T>) -> Option<T> {
    let meta = &path[..path.len() - 1];
    let on = |p: &[&str]| obj.at(p).and_then(|m| m.at(&["metadata", "annotations", name])).and_then(&read);
    if meta.is_empty() { on(&[]) } else { on(meta).or_else(|| on(&[])) }
}

/// The mode policy of a workload: its `volprep.io/modes` annotation (any value present counts,
/// so a bad one is an error, not a fallback), else the `modes` key. Err: the refusal.
fn modes_of(obj: &Node, path: &[&str], cfg: &Config) -> Result<Option<Modes>, String> {
    match annotation(obj, path, MODES_ANNOTATION, Some) {
        None => Ok(cfg.apply.modes),
        Some(v) => {
            v.as_str().unwrap_or_default().parse().map(Some).map_err(|e| format!("annotation {MODES_ANNOTATION}: {e}"))
        }
    }
}

/// The decision for one object.
pub fn decide(obj: &Node, cfg: &Config) -> Decision {
    let kind = obj.get("kind").and_then(Node::as_str).unwrap_or("");
    let Some(path) = pod_spec_path(kind) else { return other_kind(obj, kind) };
    if let Some(dup) = obj.duplicate_key() {
        return Decision::Refuse(vec![format!(
            "duplicate key {dup}: the API server's strict decoding rejects it (kubectl apply fails) and a lenient one takes the last, so inject will not guess"
        )]);
    }
    if obj.has_merge_key() {
        return Decision::Unsupported(
            "built with YAML merge keys (<<), which inject does not expand: left as it is (the kubelet's fsGroup pass, if any, stays)".into(),
        );
    }
    let Some(pod) = obj.at(path) else { return Decision::Skip("no pod spec".into()) };
    let wanted = annotation(obj, path, ANNOTATION, Node::as_bool);
    if wanted == Some(false) {
        return Decision::Skip(format!("opted out ({ANNOTATION}: \"false\")"));
    }
    let opted_in = wanted == Some(true);
    if cfg.select == Select::OptIn && !opted_in {
        return Decision::Skip(format!("not opted in ({ANNOTATION}: \"true\")"));
    }
    if containers(pod).iter().any(|c| is_volprep(c, cfg)) {
        return Decision::Skip("already injected".into());
    }
    let not_here = |why: &str| if opted_in { Decision::Refuse(vec![why.into()]) } else { Decision::Skip(why.into()) };
    let Some(fs_group_node) = pod.at(&["securityContext", "fsGroup"]).filter(|n| !n.is_null()) else {
        return not_here("no fsGroup to move");
    };
    let Some(fs_group) = fs_group_node.as_u64() else {
        return Decision::Refuse(vec!["fsGroup is not a number".into()]);
    };
    let review = review_volumes(obj, pod, cfg);
    let mut refusals = review.refusals;
    let run_as = match cfg.mode {
        Mode::Unprivileged if !review.volumes.is_empty() => match unprivileged_ids(pod, cfg) {
            Ok(ids) => Some(ids),
            Err(e) => {
                refusals.push(e);
                None
            }
        },
        _ => None,
    };
    let (modes, rules) = policy_of(obj, path, cfg, &review.volumes, &mut refusals);
    if !refusals.is_empty() {
        return Decision::Refuse(refusals);
    }
    if review.volumes.is_empty() {
        if !review.root_only.is_empty() {
            return Decision::Refuse(vec![format!(
                "mode unprivileged cannot prepare emptyDir {} (the kubelet makes it root's, and only root may change it) and there is nothing else to prepare: fsGroup is left to the kubelet",
                review.root_only.join(", ")
            )]);
        }
        return not_here("no volume the kubelet's fsGroup pass walks is mounted by a container");
    }
    let apps = apps_under_kubelet(pod, &review.volumes, modes, cfg);
    Decision::Inject(Plan { fs_group, volumes: review.volumes, run_as, modes, rules, apps })
}

/// The mode policy and the rules of a workload's volumes; what is wrong with them joins
/// `refusals`.
fn policy_of(
    obj: &Node,
    path: &[&str],
    cfg: &Config,
    volumes: &[Volume],
    refusals: &mut Vec<String>,
) -> (Option<Modes>, Vec<(String, PathRule)>) {
    let mut modes = modes_of(obj, path, cfg).unwrap_or_else(|e| {
        refusals.push(e);
        None
    });
    let rules = rules_of(obj, path).unwrap_or_else(|e| {
        refusals.push(e);
        Vec::new()
    });
    refusals.extend(rules_refusal(&rules, volumes, &mut modes));
    (modes, rules)
}

/// Why the rules cannot go on the volumes, if they cannot: one names a volume inject does not
/// walk, or the workload chose the kubelet's rule. Rules choose app-safe when nothing else did.
fn rules_refusal(rules: &[(String, PathRule)], volumes: &[Volume], modes: &mut Option<Modes>) -> Option<String> {
    if rules.is_empty() {
        return None;
    }
    let walked = |name: &str| volumes.iter().any(|v| v.name == name && v.prep == Prep::Walk);
    if let Some((name, _)) = rules.iter().find(|(name, _)| !walked(name)) {
        return Some(format!("annotation {RULES_ANNOTATION}: {name} is no volume volprep walks here"));
    }
    if *modes == Some(Modes::Kubelet) {
        return Some(format!(
            "annotation {RULES_ANNOTATION}: rules are rules of app-safe, and the workload chose the kubelet's rule"
        ));
    }
    *modes = Some(Modes::AppSafe);
    None
}

/// A kind inject does not rewrite: a refusal when it carries a pod template that sets fsGroup
/// (a Rollout-like kind inject does not know), else nothing to do.
fn other_kind(obj: &Node, kind: &str) -> Decision {
    for path in [&["spec", "template", "spec"][..], &["spec", "jobTemplate", "spec", "template", "spec"]] {
        let Some(pod) = obj.at(path) else { continue };
        if pod.get("containers").is_some() && pod.at(&["securityContext", "fsGroup"]).is_some_and(|n| !n.is_null()) {
            return Decision::Refuse(vec![format!(
                "{kind} is not a kind inject knows, and its pod template ({}) sets fsGroup: left to the kubelet",
                path.join(".")
            )]);
        }
    }
    Decision::Skip("not a pod template".into())
}

fn is_volprep(c: &Node, cfg: &Config) -> bool {
    let image = c.get("image").and_then(Node::as_str).unwrap_or("");
    let base = image.split(['@']).next().unwrap_or("").rsplit('/').next().unwrap_or("");
    let repo = base.split(':').next().unwrap_or("");
    let own = cfg.container.image.repository.rsplit('/').next().unwrap_or("");
    c.get("name").and_then(Node::as_str) == Some(cfg.container.name.as_str()) || repo == own
}

/// What the pod's volumes need: the volumes to prepare, the refusals, and the emptyDirs mode
/// unprivileged cannot prepare.
#[derive(Debug, Default)]
struct Review {
    volumes: Vec<Volume>,
    refusals: Vec<String>,
    root_only: Vec<String>,
}

/// Goes through the volumes the containers mount (a StatefulSet's claim templates win over a pod
/// volume of the same name, as its controller does), by the table of [`volumes::classify`].
fn review_volumes(obj: &Node, pod: &Node, cfg: &Config) -> Review {
    let mut r = Review::default();
    for (name, kind, class) in sources(obj, pod) {
        let mounts = mounts_of(pod, &name);
        if mounts.is_empty() || r.volumes.iter().any(|v| v.name == name) {
            continue;
        }
        let losers: Vec<&str> =
            mounts.iter().filter(|m| !runs_as_root(pod, m.container)).map(Mount::container_name).collect();
        match class {
            Class::Walked { empty_dir: true } if cfg.mode == Mode::Unprivileged => r.root_only.push(name),
            Class::Walked { empty_dir } => {
                let prep =
                    if empty_dir && mounts.iter().any(|m| is_tmp_dir(m, cfg)) { Prep::Sticky } else { Prep::Walk };
                if prep == Prep::Walk {
                    r.refusals.extend(different_users(pod, &name, &mounts));
                }
                r.volumes.push(Volume { name, prep, app_uid: app_uid_of(pod, &mounts) });
            }
            Class::AtomicWriter if !losers.is_empty() => {
                let v = pod.get("volumes").map(Node::as_seq).unwrap_or(&[]).iter();
                let source = v.filter(|v| v.get("name").and_then(Node::as_str) == Some(&name)).find_map(|v| v.get(&kind));
                if let Some(m) = source.and_then(group_only_mode) {
                    r.refusals.push(format!(
                        "volume {name} ({kind}, mode {m:04o}) is readable through its group only: without fsGroup its files keep group root and {} could no longer read them",
                        losers.join(", ")
                    ));
                }
            }
            Class::Driver if !losers.is_empty() => r.refusals.push(format!(
                "volume {name} ({kind}) mounted by {}: whether it gets the fsGroup is up to its driver (CSIDriver fsGroupPolicy, VOLUME_MOUNT_GROUP, mount gid), which a manifest does not say: left to the kubelet",
                losers.join(", ")
            )),
            Class::Unknown if !losers.is_empty() => r.refusals.push(format!(
                "volume {name} is of a type inject does not know ({kind}), mounted by {}: left to the kubelet",
                losers.join(", ")
            )),
            _ => {}
        }
    }
    r
}

/// The volumes the pod may mount, each with its type and class: the pod's volumes, but those a
/// StatefulSet's claim template of the same name replaces, then the claim templates.
fn sources(obj: &Node, pod: &Node) -> Vec<(String, String, Class)> {
    let mut sources: Vec<(String, String, Class)> = Vec::new(); // (name, type, class)
    let templates: Vec<String> = if obj.get("kind").and_then(Node::as_str) == Some("StatefulSet") {
        obj.at(&["spec", "volumeClaimTemplates"])
            .map(Node::as_seq)
            .unwrap_or(&[])
            .iter()
            .filter_map(|t| t.at(&["metadata", "name"]).and_then(Node::as_str).map(str::to_string))
            .collect()
    } else {
        Vec::new()
    };
    for v in pod.get("volumes").map(Node::as_seq).unwrap_or(&[]) {
        let Some(name) = v.get("name").and_then(Node::as_str) else { continue };
        if !templates.iter().any(|t| t == name) {
            let (kind, class) = volumes::classify(v);
            sources.push((name.to_string(), kind, class));
        }
    }
    sources.extend(
        templates.into_iter().map(|t| (t, "volumeClaimTemplates".to_string(), Class::Walked { empty_dir: false })),
    );
    sources
}

/// A refusal when the containers mounting a walked volume run as different users: they share
/// files through the fsGroup the kubelet re-applies at every start, volprep does once.
fn different_users(pod: &Node, name: &str, mounts: &[Mount]) -> Option<String> {
    let mut seen = BTreeSet::new();
    let mut list = Vec::new();
    for m in mounts {
        let u = user_of(pod, m.container);
        if seen.insert(u.clone()) {
            list.push(format!("{} {u}", m.container_name()));
        }
    }
    (list.len() > 1).then(|| {
        format!(
            "containers mounting volume {name} run as different users ({}): they share files through the fsGroup the kubelet re-applies at every start, volprep does once",
            list.join(", ")
        )
    })
}

/// The uid every container mounting a volume runs as (its `runAsUser`, else the pod's), when
/// they all set the same one and it is not root's; else none (app-safe then gives every entry
/// the kubelet's bits).
fn app_uid_of(pod: &Node, mounts: &[Mount]) -> Option<u64> {
    let uid = |c: &Node| {
        c.at(&["securityContext", "runAsUser"])
            .or_else(|| pod.at(&["securityContext", "runAsUser"]))
            .and_then(Node::as_u64)
    };
    let mut uids = mounts.iter().map(|m| uid(m.container));
    let first = uids.next()??;
    (first != 0 && uids.all(|u| u == Some(first))).then_some(first)
}

/// A mount at one of the temp dir paths, or at the container's $TMPDIR.
fn is_tmp_dir(m: &Mount, cfg: &Config) -> bool {
    let Some(path) = m.mount.get("mountPath").and_then(Node::as_str) else { return false };
    let path = path.trim_end_matches('/');
    let tmpdir = m
        .container
        .get("env")
        .map(Node::as_seq)
        .unwrap_or(&[])
        .iter()
        .find(|e| e.get("name").and_then(Node::as_str) == Some("TMPDIR"))
        .and_then(|e| e.get("value"))
        .and_then(Node::as_str);
    cfg.tmp_dirs.iter().map(|t| t.trim_end_matches('/')).chain(tmpdir).any(|t| t == path)
}

/// The first file mode of an atomic-writer volume source (its `defaultMode`, an item's `mode`,
/// a projected source's) that lets the group read but not others: the kubelet gives those
/// files the fsGroup only while fsGroup is set.
fn group_only_mode(src: &Node) -> Option<u64> {
    let mut modes: Vec<u64> = vec![src.get("defaultMode").and_then(Node::as_u64).unwrap_or(0o644)];
    let mut item_modes = |s: &Node| {
        modes.extend(s.get("items").map(Node::as_seq).unwrap_or(&[]).iter().filter_map(|i| i.get("mode")?.as_u64()))
    };
    item_modes(src);
    for s in src.get("sources").map(Node::as_seq).unwrap_or(&[]) {
        for sub in ["secret", "configMap", "downwardAPI"] {
            s.get(sub).into_iter().for_each(&mut item_modes);
        }
    }
    modes.into_iter().find(|m| m & 0o040 != 0 && m & 0o004 == 0)
}

/// Mode unprivileged: the app's uid and gid (config first, then the pod and its containers).
fn unprivileged_ids(pod: &Node, cfg: &Config) -> Result<(u64, u64), String> {
    let from_pod = |key: &str| {
        containers(pod)
            .iter()
            .find_map(|c| c.at(&["securityContext", key]).and_then(Node::as_u64))
            .or_else(|| pod.at(&["securityContext", key]).and_then(Node::as_u64))
    };
    let uid = cfg.container.run_as_user.or_else(|| from_pod("runAsUser"));
    match uid {
        Some(0) | None => Err("mode unprivileged runs volprep as the app's uid: the pod sets no non-root runAsUser (set runAsUser in the configuration)".into()),
        Some(uid) => Ok((uid, cfg.container.run_as_group.or_else(|| from_pod("runAsGroup")).unwrap_or(uid))),
    }
}
