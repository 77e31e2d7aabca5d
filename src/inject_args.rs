//! The command line and environment of `volprep inject` (clap), turned into `inject::Options`:
//! every flag is one of the configuration keys the config file and `--set` take.

use std::path::PathBuf;

use clap::builder::{BoolishValueParser, PossibleValuesParser, TypedValueParser as _};
use clap::{Args, ValueEnum};

use crate::inject::{self, Config, Node};
use crate::spec::Modes;

/// `--mode`: inject's `mode` key, as clap parses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    Root,
    Unprivileged,
}

impl From<ModeArg> for inject::Mode {
    fn from(m: ModeArg) -> inject::Mode {
        match m {
            ModeArg::Root => inject::Mode::Root,
            ModeArg::Unprivileged => inject::Mode::Unprivileged,
        }
    }
}

/// `--emit`: what goes to stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum EmitArg {
    /// The rewritten manifests.
    #[default]
    Manifests,
    /// Kustomize patches (JSON 6902 with targets) that make the same change, for a Flux
    /// HelmRelease's `postRenderers[].kustomize.patches` or a kustomization's `patches`.
    Patches,
}

/// Arguments of `inject`.
#[derive(Debug, Args)]
pub struct InjectArgs {
    /// A YAML file of configuration keys: the volprep chart's value names (image.registry,
    /// global.imageRegistry, image.repository, image.tag, image.digest, image.pullPolicy,
    /// pullSecrets, resources, securityContext, extraArgs, mode, modes, runAsUser, runAsGroup,
    /// allowForeign, threads, maxErrors, logFormat, terminationLog) and tmpDirs, select,
    /// annotateRefusals.
    #[arg(long, value_name = "FILE", env = "VOLPREP_INJECT_CONFIG")]
    pub config: Option<PathBuf>,

    /// Set a configuration key, over the config file: KEY=VALUE, VALUE in YAML
    /// (`image.tag=0.2.0`, `pullSecrets=[regcred]`). Repeatable; VOLPREP_INJECT_SET takes
    /// several, separated by ';'.
    #[arg(long = "set", value_name = "KEY=VALUE", env = "VOLPREP_INJECT_SET", value_delimiter = ';')]
    pub sets: Vec<String>,

    /// root: the init container runs as root with four capabilities and fixes every entry;
    /// unprivileged: it runs as the app's user with none (emptyDirs are then left alone).
    #[arg(long, value_name = "MODE", value_enum, env = "VOLPREP_INJECT_MODE")]
    pub mode: Option<ModeArg>,

    /// The mode policy of every volume volprep prepares (`modes=` on each --volume): kubelet
    /// (the kubelet's fsGroup rule, exactly; the default) or app-safe (the group gets access
    /// without breaking apps that insist on private modes: PostgreSQL, ssh, Erlang/RabbitMQ,
    /// GnuPG, etcd). A workload's `volprep.io/modes` annotation wins.
    #[arg(long, value_name = "MODE", env = "VOLPREP_INJECT_MODES", ignore_case = true,
          value_parser = PossibleValuesParser::new(Modes::ALL.map(Modes::word))
              .map(|w| w.parse::<Modes>().expect("a listed policy")))]
    pub modes: Option<Modes>,

    /// What to write: the rewritten manifests, or the kustomize patches that make the same
    /// change (for Flux, whose HelmRelease post-renderers take patches only).
    #[arg(long, value_name = "WHAT", value_enum, default_value_t = EmitArg::Manifests, env = "VOLPREP_INJECT_EMIT")]
    pub emit: EmitArg,

    /// The volprep image's registry ('' for none).
    #[arg(long, value_name = "HOST", env = "VOLPREP_INJECT_IMAGE_REGISTRY")]
    pub image_registry: Option<String>,

    /// The volprep image's repository.
    #[arg(long, value_name = "NAME", env = "VOLPREP_INJECT_IMAGE_REPOSITORY")]
    pub image_repository: Option<String>,

    /// The volprep image's tag.
    #[arg(long, value_name = "TAG", env = "VOLPREP_INJECT_IMAGE_TAG")]
    pub image_tag: Option<String>,

    /// The volprep image's digest (sha256:...), pinned after the tag.
    #[arg(long, value_name = "DIGEST", env = "VOLPREP_INJECT_IMAGE_DIGEST")]
    pub image_digest: Option<String>,

    /// An image pull secret added to each injected pod. Repeatable; VOLPREP_INJECT_PULL_SECRETS
    /// takes several, separated by ','.
    #[arg(long = "pull-secret", value_name = "NAME", env = "VOLPREP_INJECT_PULL_SECRETS", value_delimiter = ',')]
    pub pull_secrets: Vec<String>,

    /// An argument added to every init container's `volprep apply` (e.g. --verify=full,
    /// --reverify-after=7d, --progress-interval=30s). Repeatable; VOLPREP_INJECT_EXTRA_ARGS
    /// takes several, separated by ';'.
    #[arg(
        long = "extra-arg",
        value_name = "ARG",
        env = "VOLPREP_INJECT_EXTRA_ARGS",
        value_delimiter = ';',
        allow_hyphen_values = true
    )]
    pub extra_args: Vec<String>,

    /// Inject only the workloads annotated `volprep.io/inject: "true"` (default: every pod with
    /// an fsGroup and a volume the kubelet walks, unless annotated "false").
    #[arg(long, env = "VOLPREP_INJECT_OPT_IN", value_parser = BoolishValueParser::new())]
    pub opt_in: bool,

    /// A workload left unchanged (refused) is an error: exit 5 and nothing written.
    #[arg(long, env = "VOLPREP_INJECT_STRICT", value_parser = BoolishValueParser::new())]
    pub strict: bool,

    /// Rendered manifests: multi-document YAML, or a KRM ResourceList ('-' or none: stdin).
    /// On an error or a `--strict` refusal, write the reasons to stdout as a YAML document no
    /// Kubernetes tool takes (a literal block), and exit 0: for Helm 4's post-renderer plugins,
    /// whose failures Helm reports without the plugin's stderr, while it shows the output it
    /// cannot read. examples/inject/helm-plugin passes it.
    #[arg(long)]
    pub errors_on_stdout: bool,

    #[arg(value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

impl InjectArgs {
    /// The options, or a usage error (a bad KEY=VALUE); with `--errors-on-stdout`, options that
    /// carry the usage error to `inject::run`, which writes it where Helm 4 shows it.
    pub fn to_options(&self) -> Result<inject::Options, String> {
        match self.options() {
            Err(e) if self.errors_on_stdout => {
                Ok(inject::Options { usage_error: Some(e), errors_on_stdout: true, ..inject::Options::default() })
            }
            result => result,
        }
    }

    fn options(&self) -> Result<inject::Options, String> {
        let mut overrides: Vec<(String, Node)> = Vec::new();
        for pair in &self.sets {
            let (k, v) = pair.split_once('=').ok_or_else(|| format!("--set '{pair}' is not KEY=VALUE"))?;
            overrides.push((k.trim().to_string(), inject::value_of(v).map_err(|e| format!("--set {k}: {e}"))?));
        }
        let text = |key: &str, v: &Option<String>| v.as_ref().map(|v| (key.to_string(), Node::str(v)));
        if let Some(m) = self.mode {
            overrides.push(("mode".into(), Node::str(inject::Mode::from(m).as_str())));
        }
        if let Some(m) = self.modes {
            overrides.push(("modes".into(), Node::str(m.word())));
        }
        overrides.extend(
            [
                text("image.registry", &self.image_registry),
                text("image.repository", &self.image_repository),
                text("image.tag", &self.image_tag),
                text("image.digest", &self.image_digest),
            ]
            .into_iter()
            .flatten(),
        );
        let list = |v: &[String]| Node::seq(v.iter().map(|s| Node::str(s)).collect());
        if !self.pull_secrets.is_empty() {
            overrides.push(("pullSecrets".into(), list(&self.pull_secrets)));
        }
        if !self.extra_args.is_empty() {
            overrides.push(("extraArgs".into(), list(&self.extra_args)));
        }
        if self.opt_in {
            overrides.push(("select".into(), Node::str("opt-in")));
        }
        let mut check = Config::default();
        for (k, v) in &overrides {
            check.set(k, v)?;
        }
        Ok(inject::Options {
            files: self.files.clone(),
            config_file: self.config.clone(),
            overrides,
            refusal: inject::Refusal::from_flag(self.strict),
            errors_on_stdout: self.errors_on_stdout,
            usage_error: None,
            emit: match self.emit {
                EmitArg::Manifests => inject::Emit::Manifests,
                EmitArg::Patches => inject::Emit::Patches,
            },
        })
    }
}
