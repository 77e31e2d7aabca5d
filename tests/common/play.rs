//! Turns rendered Kubernetes manifests into what `podman kube play` runs: a StatefulSet becomes
//! its first pod (`NAME-0`) plus one PVC per volumeClaimTemplate (`CLAIM-NAME-0`), as the
//! StatefulSet controller makes them; a Deployment becomes one pod; Pods, PVCs and ConfigMaps
//! stay; everything else is dropped. The kubelet's part is added: `restartPolicy: Never` (so
//! exit codes can be read), a termination-message file bind-mounted at each container's
//! `terminationMessagePath`, PVCs bound to host directories (podman's `volume.podman.io/*`
//! annotations) and images mapped to the local ones. The app's own containers may be swapped
//! for a probe (the real app images are not at hand).

use std::path::{Path, PathBuf};

use serde_norway::{Mapping, Value};

/// How to translate.
#[derive(Default)]
pub struct PlayOpts {
    /// Image references to replace (as written in the manifest → local reference).
    pub images: Vec<(String, String)>,
    /// PVC name → the host directory it binds (a loop-mounted filesystem).
    pub claims: Vec<(String, PathBuf)>,
    /// Replaces the image and command of every container (init or app) whose image is not in
    /// `images`: the app's own images are not at hand. (image, command).
    pub app: Option<(String, Vec<String>)>,
    /// Where the termination-message files go (`POD-CONTAINER`, created empty here).
    pub termination_dir: PathBuf,
}

/// A translated pod: its name and its containers in start order (init containers first).
#[derive(Debug, Clone)]
pub struct PlayPod {
    pub name: String,
    pub init_containers: Vec<String>,
    pub containers: Vec<String>,
}

impl PlayPod {
    /// The name podman gives a container of the pod.
    pub fn container(&self, name: &str) -> String {
        format!("{}-{name}", self.name)
    }

    /// The termination-message file of a container.
    pub fn termination_file(&self, opts: &PlayOpts, container: &str) -> PathBuf {
        opts.termination_dir.join(self.container(container))
    }
}

fn key(k: &str) -> Value {
    Value::String(k.to_string())
}

fn map() -> Mapping {
    Mapping::new()
}

fn name_of(obj: &Value) -> String {
    obj["metadata"]["name"].as_str().unwrap_or_else(|| panic!("no metadata.name: {obj:?}")).to_string()
}

/// The translated documents (one YAML stream) and the pods in it.
pub fn translate(docs: &[Value], opts: &PlayOpts) -> (String, Vec<PlayPod>) {
    let mut out: Vec<Value> = Vec::new();
    let mut pods = Vec::new();
    for doc in docs {
        match doc["kind"].as_str().unwrap_or("") {
            "StatefulSet" => {
                let sts = name_of(doc);
                let pod_name = format!("{sts}-0");
                let mut spec = doc["spec"]["template"]["spec"].clone();
                for claim in doc["spec"]["volumeClaimTemplates"].as_sequence().cloned().unwrap_or_default() {
                    let claim_name = name_of(&claim);
                    let pvc_name = format!("{claim_name}-{pod_name}");
                    let mut pvc = map();
                    pvc.insert(key("apiVersion"), key("v1"));
                    pvc.insert(key("kind"), key("PersistentVolumeClaim"));
                    let mut meta = map();
                    meta.insert(key("name"), key(&pvc_name));
                    pvc.insert(key("metadata"), Value::Mapping(meta));
                    pvc.insert(key("spec"), claim["spec"].clone());
                    out.push(bind_claim(Value::Mapping(pvc), opts));
                    let mut vol = map();
                    vol.insert(key("name"), key(&claim_name));
                    let mut src = map();
                    src.insert(key("claimName"), key(&pvc_name));
                    vol.insert(key("persistentVolumeClaim"), Value::Mapping(src));
                    push_seq(&mut spec, "volumes", Value::Mapping(vol));
                }
                let labels = doc["spec"]["template"]["metadata"]["labels"].clone();
                out.push(pod(&pod_name, labels, spec, opts, &mut pods));
            }
            "Deployment" => {
                let labels = doc["spec"]["template"]["metadata"]["labels"].clone();
                out.push(pod(&name_of(doc), labels, doc["spec"]["template"]["spec"].clone(), opts, &mut pods));
            }
            "Pod" => {
                out.push(pod(&name_of(doc), doc["metadata"]["labels"].clone(), doc["spec"].clone(), opts, &mut pods))
            }
            "PersistentVolumeClaim" => out.push(bind_claim(doc.clone(), opts)),
            "ConfigMap" | "Secret" => out.push(doc.clone()),
            _ => {}
        }
    }
    let yaml = out.iter().map(|d| serde_norway::to_string(d).expect("YAML")).collect::<Vec<_>>().join("---\n");
    (yaml, pods)
}

fn push_seq(obj: &mut Value, field: &str, item: Value) {
    let m = obj.as_mapping_mut().expect("a mapping");
    let seq = m.entry(key(field)).or_insert_with(|| Value::Sequence(Vec::new()));
    if seq.is_null() {
        *seq = Value::Sequence(Vec::new());
    }
    seq.as_sequence_mut().expect("a sequence").push(item);
}

/// A PVC bound to its host directory through podman's volume annotations (a bind mount).
fn bind_claim(mut pvc: Value, opts: &PlayOpts) -> Value {
    let name = name_of(&pvc);
    let Some((_, dir)) = opts.claims.iter().find(|(n, _)| *n == name) else {
        panic!("no host directory for PVC {name}: add it to PlayOpts::claims");
    };
    let meta = pvc["metadata"].as_mapping_mut().expect("metadata");
    let ann = meta.entry(key("annotations")).or_insert_with(|| Value::Mapping(map()));
    let ann = ann.as_mapping_mut().expect("annotations");
    ann.insert(key("volume.podman.io/type"), key("none"));
    ann.insert(key("volume.podman.io/device"), key(&dir.to_string_lossy()));
    ann.insert(key("volume.podman.io/mount-options"), key("bind"));
    pvc
}

fn pod(name: &str, labels: Value, mut spec: Value, opts: &PlayOpts, pods: &mut Vec<PlayPod>) -> Value {
    let mut info = PlayPod { name: name.to_string(), init_containers: Vec::new(), containers: Vec::new() };
    spec.as_mapping_mut().expect("pod spec").insert(key("restartPolicy"), key("Never"));
    let mut extra_volumes = Vec::new();
    for (field, init) in [("initContainers", true), ("containers", false)] {
        let Some(list) = spec.get_mut(field).and_then(Value::as_sequence_mut) else { continue };
        for c in list.iter_mut() {
            let cname = c["name"].as_str().expect("container name").to_string();
            let m = c.as_mapping_mut().expect("container");
            let image = m.get("image").and_then(Value::as_str).unwrap_or("").to_string();
            if let Some((_, to)) = opts.images.iter().find(|(from, _)| *from == image) {
                m.insert(key("image"), key(to));
            } else if let Some((image, command)) = &opts.app {
                m.insert(key("image"), key(image));
                m.insert(key("command"), Value::Sequence(command.iter().map(|s| key(s)).collect()));
                m.remove("args");
            }
            // The kubelet's termination-message file: an empty file bind-mounted at the path.
            let path = m.get("terminationMessagePath").and_then(Value::as_str).unwrap_or("/dev/termination-log");
            let path = path.to_string();
            let file = opts.termination_dir.join(format!("{name}-{cname}"));
            std::fs::write(&file, "").expect("termination file");
            let vol = format!("termination-{cname}");
            let mut mount = map();
            mount.insert(key("name"), key(&vol));
            mount.insert(key("mountPath"), key(&path));
            let mounts = m.entry(key("volumeMounts")).or_insert_with(|| Value::Sequence(Vec::new()));
            mounts.as_sequence_mut().expect("volumeMounts").push(Value::Mapping(mount));
            extra_volumes.push(host_file_volume(&vol, &file));
            if init { info.init_containers.push(cname) } else { info.containers.push(cname) }
        }
    }
    for v in extra_volumes {
        push_seq(&mut spec, "volumes", v);
    }
    let mut meta = map();
    meta.insert(key("name"), key(name));
    // podman removes "once" init containers after they run: keep them, to read their exit
    // codes and logs (they run once here all the same: the pod is not restarted).
    let mut ann = map();
    ann.insert(key("io.podman.annotations.init.container.type"), key("always"));
    meta.insert(key("annotations"), Value::Mapping(ann));
    if !labels.is_null() {
        meta.insert(key("labels"), labels);
    }
    let mut p = map();
    p.insert(key("apiVersion"), key("v1"));
    p.insert(key("kind"), key("Pod"));
    p.insert(key("metadata"), Value::Mapping(meta));
    p.insert(key("spec"), spec);
    pods.push(info);
    Value::Mapping(p)
}

fn host_file_volume(name: &str, file: &Path) -> Value {
    let mut src = map();
    src.insert(key("path"), key(&file.to_string_lossy()));
    src.insert(key("type"), key("File"));
    let mut v = map();
    v.insert(key("name"), key(name));
    v.insert(key("hostPath"), Value::Mapping(src));
    Value::Mapping(v)
}
