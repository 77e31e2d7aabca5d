//! What `inject` adds to a pod: the volprep chart's value names (`image.tag`, `pullSecrets`,
//! `resources`, `extraArgs`, `mode`, ...), set from a config file, a KRM function config,
//! environment variables or flags, each a `KEY=VALUE` with a YAML value.

use super::node::Node;
use super::parse::parse;

/// Root (four capabilities, fixes every entry) or the app's user with none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Root,
    Unprivileged,
}

/// Which pod templates are injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Select {
    /// Every pod with an fsGroup and a volume the kubelet walks, unless annotated "false".
    Auto,
    /// Only the pods annotated `volprep.io/inject: "true"`.
    OptIn,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub name: String,
    pub mode: Mode,
    pub select: Select,
    pub run_as_user: Option<u64>,
    pub run_as_group: Option<u64>,
    pub allow_foreign: bool,
    pub registry: String,
    pub repository: String,
    pub tag: String,
    pub digest: String,
    pub pull_policy: String,
    pub pull_secrets: Vec<String>,
    /// Replaces the default resources as a whole.
    pub resources: Node,
    /// Replaces the mode's default securityContext as a whole.
    pub security_context: Option<Node>,
    pub extra_args: Vec<String>,
    pub log_format: String,
    pub termination_log: String,
    pub threads: u64,
    pub max_errors: u64,
    /// Mount paths where an emptyDir is a temp dir (made 01777, `--sticky`), besides $TMPDIR.
    pub tmp_dirs: Vec<String>,
}

impl Default for Config {
    fn default() -> Config {
        let resources = parse("requests: {cpu: 100m, memory: 32Mi}\nlimits: {cpu: \"1\", memory: 128Mi}\n")
            .expect("default resources")
            .remove(0);
        Config {
            name: "volprep".into(),
            mode: Mode::Root,
            select: Select::Auto,
            run_as_user: None,
            run_as_group: None,
            allow_foreign: false,
            registry: "registry.example.com".into(),
            repository: "volprep".into(),
            tag: env!("CARGO_PKG_VERSION").into(),
            digest: String::new(),
            pull_policy: "IfNotPresent".into(),
            pull_secrets: Vec::new(),
            resources,
            security_context: None,
            extra_args: Vec::new(),
            log_format: "json".into(),
            termination_log: "/dev/termination-log".into(),
            threads: 0,
            max_errors: 0,
            tmp_dirs: vec!["/tmp".into(), "/var/tmp".into()],
        }
    }
}

/// Every key `set` knows, as in the chart's values.
pub const KEYS: &[&str] = &[
    "name",
    "mode",
    "select",
    "runAsUser",
    "runAsGroup",
    "allowForeign",
    "image.registry",
    "image.repository",
    "image.tag",
    "image.digest",
    "image.pullPolicy",
    "pullSecrets",
    "resources",
    "securityContext",
    "extraArgs",
    "logFormat",
    "terminationLog",
    "threads",
    "maxErrors",
    "tmpDirs",
];

impl Config {
    /// The image reference: registry/repository:tag@digest.
    pub fn image(&self) -> String {
        let mut r = self.repository.clone();
        if !self.registry.is_empty() {
            r = format!("{}/{r}", self.registry);
        }
        if !self.tag.is_empty() {
            r = format!("{r}:{}", self.tag);
        }
        if !self.digest.is_empty() {
            r = format!("{r}@{}", self.digest);
        }
        r
    }

    /// Sets every key of a mapping (a config file, a KRM function config's `spec`); `image`
    /// may be a mapping of its keys.
    pub fn merge(&mut self, map: &Node) -> Result<(), String> {
        let Node::Map { entries, .. } = map else { return Err("the configuration is not a mapping".into()) };
        for (k, v) in entries {
            let key = k.as_str().unwrap_or_default();
            if key == "image" && v.is_map() {
                let Node::Map { entries: image, .. } = v else { unreachable!() };
                for (ik, iv) in image {
                    self.set(&format!("image.{}", ik.as_str().unwrap_or_default()), iv)?;
                }
            } else {
                self.set(key, v)?;
            }
        }
        Ok(())
    }

    /// `KEY=VALUE` (as `--set` takes them): VALUE is YAML (`pullSecrets=[a, b]`, `threads=8`).
    #[cfg(test)]
    pub fn set_pair(&mut self, pair: &str) -> Result<(), String> {
        let (k, v) = pair.split_once('=').ok_or_else(|| format!("'{pair}' is not KEY=VALUE"))?;
        let value = value_of(v).map_err(|e| format!("{k}: {e}"))?;
        self.set(k.trim(), &value)
    }

    /// Sets one key from a YAML value.
    pub fn set(&mut self, key: &str, v: &Node) -> Result<(), String> {
        let err = |what: &str| format!("{key}: {what}");
        let s = || v.as_str().map(str::to_string).ok_or_else(|| err("a string is needed"));
        let n = || v.as_u64().ok_or_else(|| err("a non-negative integer is needed"));
        let list = || -> Result<Vec<String>, String> {
            let items = match v {
                Node::Seq { items, .. } => items.as_slice(),
                _ if v.is_null() => &[],
                _ => return Err(err("a list is needed")),
            };
            items
                .iter()
                .map(|i| i.as_str().map(str::to_string).ok_or_else(|| err("a list of strings is needed")))
                .collect()
        };
        match key {
            "name" => self.name = s()?,
            "mode" => {
                self.mode = match s()?.as_str() {
                    "root" => Mode::Root,
                    "unprivileged" => Mode::Unprivileged,
                    other => return Err(err(&format!("'{other}' is neither root nor unprivileged"))),
                }
            }
            "select" => {
                self.select = match s()?.as_str() {
                    "auto" => Select::Auto,
                    "opt-in" => Select::OptIn,
                    other => return Err(err(&format!("'{other}' is neither auto nor opt-in"))),
                }
            }
            "runAsUser" => self.run_as_user = if v.is_null() { None } else { Some(n()?) },
            "runAsGroup" => self.run_as_group = if v.is_null() { None } else { Some(n()?) },
            "allowForeign" => self.allow_foreign = v.as_bool().ok_or_else(|| err("true or false is needed"))?,
            "image.registry" => self.registry = v.as_str().unwrap_or_default().to_string(),
            "image.repository" => self.repository = s()?,
            "image.tag" => self.tag = v.as_str().unwrap_or_default().to_string(),
            "image.digest" => self.digest = v.as_str().unwrap_or_default().to_string(),
            "image.pullPolicy" => self.pull_policy = s()?,
            "pullSecrets" => self.pull_secrets = list()?,
            "resources" if v.is_map() => self.resources = v.clone(),
            "securityContext" if v.is_map() => self.security_context = Some(v.clone()),
            "securityContext" if v.is_null() => self.security_context = None,
            "resources" | "securityContext" => return Err(err("a mapping is needed")),
            "extraArgs" => self.extra_args = list()?,
            "logFormat" => self.log_format = v.as_str().unwrap_or_default().to_string(),
            "terminationLog" => self.termination_log = v.as_str().unwrap_or_default().to_string(),
            "threads" => self.threads = n()?,
            "maxErrors" => self.max_errors = n()?,
            "tmpDirs" => self.tmp_dirs = list()?,
            _ => return Err(format!("{key}: unknown key (known: {})", KEYS.join(", "))),
        }
        Ok(())
    }
}

/// A YAML value given on a command line or in an environment variable.
pub fn value_of(text: &str) -> Result<Node, String> {
    let docs = parse(text).map_err(|e| e.msg)?;
    match docs.len() {
        0 => Ok(Node::plain("")),
        1 => Ok(docs.into_iter().next().expect("one")),
        _ => Err("more than one YAML document".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_names_set_the_values() {
        let mut c = Config::default();
        let file = parse("image:\n  registry: \"\"\n  tag: \"0.2\"\n  digest: sha256:ab\npullSecrets: [regcred]\nmode: unprivileged\nthreads: 8\n")
            .unwrap()
            .remove(0);
        c.merge(&file).unwrap();
        c.set_pair("extraArgs=[--verify=full, --reverify-after=7d]").unwrap();
        assert_eq!(c.image(), "volprep:0.2@sha256:ab");
        assert_eq!((c.mode, c.threads), (Mode::Unprivileged, 8));
        assert_eq!(c.pull_secrets, ["regcred"]);
        assert_eq!(c.extra_args, ["--verify=full", "--reverify-after=7d"]);
    }

    #[test]
    fn bad_keys_and_values_are_refused() {
        let mut c = Config::default();
        assert!(c.set_pair("fsgroup=1").unwrap_err().contains("unknown key"));
        assert!(c.set_pair("mode=privileged").unwrap_err().contains("neither root nor unprivileged"));
        assert!(c.set_pair("threads=-1").is_err());
        assert!(c.set_pair("resources=1").is_err());
        assert!(c.set_pair("novalue").is_err());
        assert_eq!(Config::default().image(), format!("registry.example.com/volprep:{}", env!("CARGO_PKG_VERSION")));
    }
}
