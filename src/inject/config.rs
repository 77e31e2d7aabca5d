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

/// Everything `inject` adds, by the chart's value names.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub mode: Mode,
    pub select: Select,
    pub container: Container,
    pub apply: ApplyArgs,
    /// Mount paths where an emptyDir is a temp dir (made 01777, `--sticky`), besides $TMPDIR.
    pub tmp_dirs: Vec<String>,
}

/// The init container (`name`, `image.*`, `pullSecrets`, `runAsUser`, `runAsGroup`,
/// `resources`, `securityContext`).
#[derive(Debug, Clone, PartialEq)]
pub struct Container {
    pub name: String,
    pub image: Image,
    /// `runAsUser`/`runAsGroup` of the unprivileged init container (default: the pod's).
    pub run_as_user: Option<u64>,
    pub run_as_group: Option<u64>,
    /// Replaces the default resources as a whole.
    pub resources: Node,
    /// Replaces the mode's default securityContext as a whole.
    pub security_context: Option<Node>,
}

/// The volprep image and how it is pulled (`image.*`, `pullSecrets`).
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub registry: String,
    pub repository: String,
    pub tag: String,
    pub digest: String,
    pub pull_policy: String,
    pub pull_secrets: Vec<String>,
}

/// What the init container's `volprep apply` is given besides its volumes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ApplyArgs {
    pub allow_foreign: bool,
    pub threads: u64,
    pub max_errors: u64,
    pub log_format: String,
    pub termination_log: String,
    pub extra_args: Vec<String>,
}

impl Default for Config {
    fn default() -> Config {
        let resources = parse("requests: {cpu: 100m, memory: 32Mi}\nlimits: {cpu: \"1\", memory: 128Mi}\n")
            .expect("default resources")
            .remove(0);
        let image = Image {
            registry: "registry.example.com".into(),
            repository: "volprep".into(),
            tag: env!("CARGO_PKG_VERSION").into(),
            digest: String::new(),
            pull_policy: "IfNotPresent".into(),
            pull_secrets: Vec::new(),
        };
        Config {
            mode: Mode::Root,
            select: Select::Auto,
            container: Container {
                name: "volprep".into(),
                image,
                run_as_user: None,
                run_as_group: None,
                resources,
                security_context: None,
            },
            apply: ApplyArgs {
                log_format: "json".into(),
                termination_log: "/dev/termination-log".into(),
                ..ApplyArgs::default()
            },
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

impl Image {
    /// The image reference: registry/repository:tag@digest.
    pub fn reference(&self) -> String {
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

    /// Sets one of its keys; false when `s` is not one.
    fn set(&mut self, s: &Setting) -> Result<bool, String> {
        match s.key {
            "image.registry" => self.registry = s.text(),
            "image.repository" => self.repository = s.string()?,
            "image.tag" => self.tag = s.text(),
            "image.digest" => self.digest = s.text(),
            "image.pullPolicy" => self.pull_policy = s.string()?,
            "pullSecrets" => self.pull_secrets = s.list()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl Container {
    /// Sets one of its keys (or of its image's); false when `s` is not one.
    fn set(&mut self, s: &Setting) -> Result<bool, String> {
        match s.key {
            "name" => self.name = s.string()?,
            "runAsUser" => self.run_as_user = s.optional_count()?,
            "runAsGroup" => self.run_as_group = s.optional_count()?,
            "resources" => self.resources = s.mapping()?,
            "securityContext" if s.v.is_null() => self.security_context = None,
            "securityContext" => self.security_context = Some(s.mapping()?),
            _ => return self.image.set(s),
        }
        Ok(true)
    }
}

impl ApplyArgs {
    /// Sets one of its keys; false when `s` is not one.
    fn set(&mut self, s: &Setting) -> Result<bool, String> {
        match s.key {
            "allowForeign" => self.allow_foreign = s.v.as_bool().ok_or_else(|| s.err("true or false is needed"))?,
            "threads" => self.threads = s.count()?,
            "maxErrors" => self.max_errors = s.count()?,
            "logFormat" => self.log_format = s.text(),
            "terminationLog" => self.termination_log = s.text(),
            "extraArgs" => self.extra_args = s.list()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl Config {
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
        let s = Setting { key, v };
        match key {
            "mode" => self.mode = s.one_of(&[("root", Mode::Root), ("unprivileged", Mode::Unprivileged)])?,
            "select" => self.select = s.one_of(&[("auto", Select::Auto), ("opt-in", Select::OptIn)])?,
            "tmpDirs" => self.tmp_dirs = s.list()?,
            _ if self.container.set(&s)? || self.apply.set(&s)? => {}
            _ => return Err(format!("{key}: unknown key (known: {})", KEYS.join(", "))),
        }
        Ok(())
    }
}

/// One key being set to a YAML value, with the conversions the keys need.
struct Setting<'a> {
    key: &'a str,
    v: &'a Node,
}

impl Setting<'_> {
    fn err(&self, what: &str) -> String {
        format!("{}: {what}", self.key)
    }

    /// A string, required.
    fn string(&self) -> Result<String, String> {
        self.v.as_str().map(str::to_string).ok_or_else(|| self.err("a string is needed"))
    }

    /// A string; anything else (null) is "".
    fn text(&self) -> String {
        self.v.as_str().unwrap_or_default().to_string()
    }

    fn count(&self) -> Result<u64, String> {
        self.v.as_u64().ok_or_else(|| self.err("a non-negative integer is needed"))
    }

    /// A count, or null for none.
    fn optional_count(&self) -> Result<Option<u64>, String> {
        if self.v.is_null() { Ok(None) } else { self.count().map(Some) }
    }

    /// A list of strings; null is the empty list.
    fn list(&self) -> Result<Vec<String>, String> {
        let items = match self.v {
            Node::Seq { items, .. } => items.as_slice(),
            _ if self.v.is_null() => &[],
            _ => return Err(self.err("a list is needed")),
        };
        items
            .iter()
            .map(|i| i.as_str().map(str::to_string).ok_or_else(|| self.err("a list of strings is needed")))
            .collect()
    }

    fn mapping(&self) -> Result<Node, String> {
        if self.v.is_map() { Ok(self.v.clone()) } else { Err(self.err("a mapping is needed")) }
    }

    /// One of two words.
    fn one_of<T: Copy>(&self, words: &[(&str, T); 2]) -> Result<T, String> {
        let word = self.string()?;
        let [(a, _), (b, _)] = words;
        words
            .iter()
            .find(|(w, _)| *w == word)
            .map(|&(_, t)| t)
            .ok_or_else(|| self.err(&format!("'{word}' is neither {a} nor {b}")))
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
        assert_eq!(c.container.image.reference(), "volprep:0.2@sha256:ab");
        assert_eq!((c.mode, c.apply.threads), (Mode::Unprivileged, 8));
        assert_eq!(c.container.image.pull_secrets, ["regcred"]);
        assert_eq!(c.apply.extra_args, ["--verify=full", "--reverify-after=7d"]);
    }

    #[test]
    fn bad_keys_and_values_are_refused() {
        let mut c = Config::default();
        assert!(c.set_pair("fsgroup=1").unwrap_err().contains("unknown key"));
        assert!(c.set_pair("mode=privileged").unwrap_err().contains("neither root nor unprivileged"));
        assert!(c.set_pair("threads=-1").is_err());
        assert!(c.set_pair("resources=1").is_err());
        assert!(c.set_pair("novalue").is_err());
        assert_eq!(
            Config::default().container.image.reference(),
            format!("registry.example.com/volprep:{}", env!("CARGO_PKG_VERSION"))
        );
    }
}
