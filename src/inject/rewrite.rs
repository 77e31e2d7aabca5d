//! Applies a [`Plan`] to a pod template, as the volprep library chart writes it: the volprep
//! init container first, each volume at /volumes/NAME with its spec, and the pod's fsGroup
//! moved to supplementalGroups (fsGroupChangePolicy dropped).

use super::config::{Config, Mode};
use super::node::Node;
use super::parse::parse;
use super::select::{Plan, Prep};
use crate::spec::Modes;

/// Where the init container mounts each volume.
pub const MOUNT_DIR: &str = "/volumes";

/// Rewrites the pod spec of `obj` at `path`.
pub fn apply(obj: &mut Node, path: &[&str], plan: &Plan, cfg: &Config) {
    let Some(pod) = obj.at_mut(path) else { return };
    let psc = pod.map_at("securityContext");
    psc.remove("fsGroup");
    psc.remove("fsGroupChangePolicy");
    let groups = psc.seq_at("supplementalGroups");
    if !groups.iter().any(|g| g.as_u64() == Some(plan.fs_group)) {
        groups.push(Node::int(plan.fs_group));
    }
    if !cfg.container.image.pull_secrets.is_empty() {
        let secrets = pod.seq_at("imagePullSecrets");
        for s in &cfg.container.image.pull_secrets {
            if !secrets.iter().any(|n| n.get("name").and_then(Node::as_str) == Some(s.as_str())) {
                let mut entry = Node::map();
                entry.set("name", Node::str(s));
                secrets.push(entry);
            }
        }
    }
    pod.seq_at("initContainers").insert(0, container(plan, cfg));
}

/// The container's args: the subcommand, the options, extraArgs, then a `--volume` or
/// `--sticky` per volume. A `--volume` says `modes=` when the plan's policy is not what
/// `volprep apply` gives it without (so the kubelet's rule, the default, adds nothing).
pub fn args(plan: &Plan, cfg: &Config) -> Vec<String> {
    let mut a = vec!["apply".to_string()];
    if cfg.mode == Mode::Unprivileged {
        a.push("--unprivileged".into());
        if cfg.apply.allow_foreign {
            a.push("--allow-foreign".into());
        }
    }
    if cfg.apply.threads > 0 {
        a.push(format!("--threads={}", cfg.apply.threads));
    }
    if cfg.apply.max_errors > 0 {
        a.push(format!("--max-errors={}", cfg.apply.max_errors));
    }
    a.push(format!("--log-format={}", cfg.apply.log_format.as_str()));
    if !cfg.apply.termination_log.is_empty() {
        a.push(format!("--termination-log={}", cfg.apply.termination_log));
    }
    a.extend(cfg.apply.extra_args.iter().cloned());
    let implied = implied_modes(&cfg.apply.extra_args);
    let modes = match plan.modes {
        Some(m) if Some(m) != implied => format!(",modes={m}"),
        _ => String::new(),
    };
    let app_safe = plan.modes.or(implied) == Some(Modes::AppSafe);
    for v in &plan.volumes {
        let at = format!("{MOUNT_DIR}/{}", v.name);
        let app_uid = match v.app_uid {
            Some(uid) if app_safe => format!(",app-uid={uid}"),
            _ => String::new(),
        };
        let rules: String =
            plan.rules.iter().filter(|(name, _)| *name == v.name).map(|(_, r)| format!(",rule={}", r.text())).collect();
        a.push(match v.prep {
            Prep::Walk => format!("--volume={at},fs-group={}{modes}{app_uid}{rules}", plan.fs_group),
            Prep::Sticky => format!("--sticky={at}"),
        });
    }
    a
}

/// The mode policy `volprep apply` gives a `--volume` without `modes=`: the last `--modes`
/// among `extra` args, else the kubelet's rule; None when that `--modes` names no policy.
pub fn implied_modes(extra: &[String]) -> Option<Modes> {
    let mut implied = Some(Modes::Kubelet);
    let mut it = extra.iter();
    while let Some(arg) = it.next() {
        let value = match arg.strip_prefix("--modes=") {
            Some(v) => Some(v),
            None if arg == "--modes" => it.next().map(String::as_str),
            None => continue,
        };
        implied = value.and_then(|v| v.parse().ok());
    }
    implied
}

fn container(plan: &Plan, cfg: &Config) -> Node {
    let mut c = Node::map();
    c.set("name", Node::str(&cfg.container.name));
    c.set("image", Node::str(&cfg.container.image.reference()));
    c.set("imagePullPolicy", Node::str(&cfg.container.image.pull_policy));
    c.set("args", Node::seq(args(plan, cfg).iter().map(|s| Node::str(s)).collect()));
    c.set("terminationMessagePolicy", Node::str("FallbackToLogsOnError"));
    c.set("securityContext", security_context(plan, cfg));
    c.set("resources", cfg.container.resources.clone());
    let mounts = plan
        .volumes
        .iter()
        .map(|v| {
            let mut m = Node::map();
            m.set("name", Node::str(&v.name));
            m.set("mountPath", Node::str(&format!("{MOUNT_DIR}/{}", v.name)));
            m
        })
        .collect();
    c.set("volumeMounts", Node::seq(mounts));
    c
}

/// Least privilege: root with CHOWN, DAC_OVERRIDE, FOWNER and FSETID (the chart's default and
/// why), or in mode unprivileged the app's ids with no capability ("restricted").
fn security_context(plan: &Plan, cfg: &Config) -> Node {
    if let Some(sc) = &cfg.container.security_context {
        return sc.clone();
    }
    let (user, group, non_root, add) = match plan.run_as {
        Some((u, g)) => (u, g, "true", ""),
        None => (0, 0, "false", "\n  add: [CHOWN, DAC_OVERRIDE, FOWNER, FSETID]"),
    };
    let text = format!(
        "runAsUser: {user}\nrunAsGroup: {group}\nrunAsNonRoot: {non_root}\nprivileged: false\nallowPrivilegeEscalation: false\nreadOnlyRootFilesystem: true\ncapabilities:\n  drop: [ALL]{add}\nseccompProfile:\n  type: RuntimeDefault\n"
    );
    parse(&text).expect("securityContext template").remove(0)
}
