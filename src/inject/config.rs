//! What `inject` adds to a pod: the volprep chart's value names (`image.tag`, `pullSecrets`,
//! `resources`, `extraArgs`, `mode`, ...), set from a config file, a KRM function config,
//! environment variables or flags, each a `KEY=VALUE` with a YAML value.

use super::node::Node;
use super::parse::parse;
use crate::options::LogFormat;
use crate::spec::Modes;

/// Root (four capabilities, fixes every entry) or the app's user with none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Root,
    Unprivileged,
}

impl Mode {
    /// The word the `mode` key takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Root => "root",
            Mode::Unprivileged => "unprivileged",
        }
    }
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
    /// A refused workload gets an annotation saying why ([`REFUSED_ANNOTATION`]).
    pub annotate_refusals: bool,
}

/// The annotation a refused workload gets (when `annotateRefusals`): why it was left to the
/// kubelet. Removed again when the workload is injected.
pub const REFUSED_ANNOTATION: &str = "volprep.io/inject-refused";

/// The image the volprep chart defaults to (examples/helm/volprep/values.yaml).
pub const DEFAULT_REGISTRY: &str = "ghcr.io";
pub const DEFAULT_REPOSITORY: &str = "volprep/volprep";

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
    /// `global.imageRegistry`: wins over `registry` when set, as in the chart (a mirror).
    pub global_registry: String,
    pub repository: String,
    pub tag: String,
    pub digest: String,
    pub pull_policy: String,
    pub pull_secrets: Vec<String>,
}

/// What the init container's `volprep apply` is given: options, and the mode policy of its
/// volumes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ApplyArgs {
    /// `modes`: the mode policy each `--volume` gets (`modes=`), unless the workload's
    /// `volprep.io/modes` annotation says another; None: not chosen (the kubelet's rule).
    pub modes: Option<Modes>,
    pub allow_foreign: bool,
    pub threads: u64,
    pub max_errors: u64,
    /// How the init container's volprep logs (`--log-format`): JSON unless set, for the
    /// cluster's log collector.
    pub log_format: LogFormat,
    pub termination_log: String,
    pub extra_args: Vec<String>,
}

impl Default for Config {
    fn default() -> Config {
        let resources = parse("requests: {cpu: 100m, memory: 32Mi}\nlimits: {cpu: \"1\", memory: 128Mi}\n")
            .expect("default resources")
            .remove(0);
        let image = Image {
            registry: DEFAULT_REGISTRY.into(),
            global_registry: String::new(),
            repository: DEFAULT_REPOSITORY.into(),
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
                log_format: LogFormat::Json,
                termination_log: "/dev/termination-log".into(),
                ..ApplyArgs::default()
            },
            tmp_dirs: vec!["/tmp".into(), "/var/tmp".into()],
            annotate_refusals: true,
        }
    }
}

/// Every key `set` knows, as in the chart's values.
pub const KEYS: &[&str] = &[
    "name",
    "mode",
    "modes",
    "select",
    "runAsUser",
    "runAsGroup",
    "allowForeign",
    "image.registry",
    "global.imageRegistry",
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
    "annotateRefusals",
];

impl Image {
    /// The image reference: registry/repository:tag@digest, `global.imageRegistry` over
    /// `image.registry`, as the chart writes it.
    pub fn reference(&self) -> String {
        let mut r = self.repository.clone();
        let registry = if self.global_registry.is_empty() { &self.registry } else { &self.global_registry };
        if !registry.is_empty() {
            r = format!("{registry}/{r}");
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
            "global.imageRegistry" => self.global_registry = s.text(),
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
            "modes" if s.v.is_null() => self.modes = None,
            "modes" => self.modes = Some(s.string()?.parse().map_err(|e: String| s.err(&e))?),
            "allowForeign" => self.allow_foreign = s.v.as_bool().ok_or_else(|| s.err("true or false is needed"))?,
            "threads" => self.threads = s.count()?,
            "maxErrors" => self.max_errors = s.count()?,
            "logFormat" => {
                self.log_format = s.one_of(&[LogFormat::Text, LogFormat::Json].map(|f| (f.as_str(), f)))?;
            }
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
            if (key == "image" || key == "global") && v.is_map() {
                let Node::Map { entries: inner, .. } = v else { unreachable!() };
                for (ik, iv) in inner {
                    self.set(&format!("{key}.{}", ik.as_str().unwrap_or_default()), iv)?;
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
            "annotateRefusals" => {
                self.annotate_refusals = s.v.as_bool().ok_or_else(|| s.err("true or false is needed"))?;
            }
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
        let file = parse("image:\n  registry: \"\"\n  tag: \"0.2\"\n  digest: sha256:ab\npullSecrets: [regcred]\nmode: unprivileged\nmodes: app-safe\nthreads: 8\n")
            .unwrap()
            .remove(0);
        c.merge(&file).unwrap();
        c.set_pair("extraArgs=[--verify=full, --reverify-after=7d]").unwrap();
        assert_eq!(c.container.image.reference(), "volprep/volprep:0.2@sha256:ab");
        assert_eq!((c.mode, c.apply.threads), (Mode::Unprivileged, 8));
        assert_eq!(c.container.image.pull_secrets, ["regcred"]);
        assert_eq!(c.apply.modes, Some(crate::spec::Modes::AppSafe));
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
        assert!(c.set_pair("logFormat=xml").unwrap_err().contains("neither text nor json"));
        assert_eq!(
            c.set_pair("modes=strict").unwrap_err(),
            "modes: 'strict' is not a mode policy: kubelet or app-safe"
        );
        assert!(c.set_pair("modes=[app-safe]").is_err());
    }

    /// The default image is the chart's (examples/helm/volprep/values.yaml), which the release
    /// workflow publishes; `global.imageRegistry` wins over `image.registry`, as in the chart.
    #[test]
    fn default_image_is_the_charts() {
        let values =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/helm/volprep/values.yaml")).unwrap();
        let v = parse(&values).unwrap().remove(0);
        let chart = |k: &str| v.at(&["image", k]).and_then(Node::as_str).unwrap().to_string();
        let image = Config::default().container.image;
        assert_eq!(
            image.reference(),
            format!("{}/{}:{}", chart("registry"), chart("repository"), chart("tag")),
            "inject's default image is the chart's"
        );
        assert_eq!(chart("tag"), env!("CARGO_PKG_VERSION"));
        let mut c = Config::default();
        c.merge(&parse("global: {imageRegistry: mirror.internal:5000}\n").unwrap().remove(0)).unwrap();
        assert_eq!(c.container.image.reference(), format!("mirror.internal:5000/volprep/volprep:{}", chart("tag")));
    }
}
