//! What the kubelet does with a pod's `fsGroup` for each volume type of a pod spec, and which
//! containers mount each volume: the table of docs/inject.md ("Volume types"), each row from the
//! kubelet's volume plugin that sets the volume up.

use super::node::Node;

/// What the kubelet's fsGroup handling does to one volume type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Walked: the plugin's `SetUpAt` calls `volume.SetVolumeOwnership` over the whole tree
    /// (pkg/volume/volume_linux.go). volprep prepares it instead.
    Walked { empty_dir: bool },
    /// Written by the kubelet's atomic writer, then given the fsGroup (secret, configMap,
    /// downwardAPI, projected): without fsGroup its files are root's, with the volume's modes.
    AtomicWriter,
    /// The fsGroup is the CSI driver's or a mount option's to apply (inline `csi`: its CSIDriver's
    /// `fsGroupPolicy` and VOLUME_MOUNT_GROUP; `azureFile`: the mount's gid): a manifest does
    /// not say which, so inject does not guess.
    Driver,
    /// The kubelet leaves ownership alone: read-only volumes, hostPath, nfs, cephfs, image ...
    NotWalked,
    /// A volume type this table does not know.
    Unknown,
}

/// Block devices and the CSI-migrated in-tree disks: walked unless `readOnly: true`
/// (pkg/volume/iscsi/disk_manager.go and pkg/volume/fc/disk_manager.go `diskSetUp`; the
/// migrated ones through pkg/volume/csi/csi_mounter.go `supportsFSGroup`, which skips a
/// read-only mount; pkg/volume/flexvolume/mounter.go for flexVolume).
const DISKS: &[&str] = &[
    "iscsi",
    "fc",
    "rbd",
    "awsElasticBlockStore",
    "gcePersistentDisk",
    "azureDisk",
    "cinder",
    "vsphereVolume",
    "portworxVolume",
    "photonPersistentDisk",
    "scaleIO",
    "storageos",
    "flocker",
    "flexVolume",
];

/// Files the kubelet writes (pkg/volume/util/atomic_writer.go), then `SetVolumeOwnership`
/// (pkg/volume/secret/secret.go, configmap/configmap.go, downwardapi/downwardapi.go,
/// projected/projected.go).
pub const ATOMIC_WRITER: &[&str] = &["secret", "configMap", "downwardAPI", "projected"];

/// No `SetVolumeOwnership` in their plugins (pkg/volume/hostpath, nfs, cephfs, glusterfs,
/// quobyte, image).
const NOT_WALKED: &[&str] = &["hostPath", "nfs", "cephfs", "glusterfs", "quobyte", "image"];

/// A pod volume's type (the key beside `name`) and what the kubelet does with it.
pub fn classify(volume: &Node) -> (String, Class) {
    let Node::Map { entries, .. } = volume else { return (String::new(), Class::Unknown) };
    let Some((key, source)) = entries.iter().find(|(k, _)| k.as_str() != Some("name")) else {
        return (String::new(), Class::Unknown);
    };
    let kind = key.as_str().unwrap_or_default().to_string();
    let read_only = source.get("readOnly").and_then(Node::as_bool) == Some(true);
    let class = match kind.as_str() {
        // pkg/volume/emptydir/empty_dir.go `SetUpAt`: every medium.
        "emptyDir" => Class::Walked { empty_dir: true },
        // The claim's volume, by its own plugin (mostly CSI: csi_mounter.go); pod-level
        // `readOnly` makes the mount read-only, which no plugin walks.
        "persistentVolumeClaim" if read_only => Class::NotWalked,
        "persistentVolumeClaim" | "ephemeral" => Class::Walked { empty_dir: false },
        // pkg/volume/git_repo/git_repo.go: an emptyDir cloned into, then walked.
        "gitRepo" => Class::Walked { empty_dir: false },
        "csi" if read_only => Class::NotWalked,
        "csi" | "azureFile" => Class::Driver,
        k if DISKS.contains(&k) && read_only => Class::NotWalked,
        k if DISKS.contains(&k) => Class::Walked { empty_dir: false },
        k if ATOMIC_WRITER.contains(&k) => Class::AtomicWriter,
        k if NOT_WALKED.contains(&k) => Class::NotWalked,
        _ => Class::Unknown,
    };
    (kind, class)
}

/// One container's mount of a volume.
#[derive(Debug, Clone, Copy)]
pub struct Mount<'a> {
    pub container: &'a Node,
    pub mount: &'a Node,
}

impl<'a> Mount<'a> {
    pub fn container_name(&self) -> &'a str {
        self.container.get("name").and_then(Node::as_str).unwrap_or("?")
    }
}

/// Init containers, then containers.
pub fn containers(pod: &Node) -> Vec<&Node> {
    ["initContainers", "containers"].iter().flat_map(|k| pod.get(k).map(Node::as_seq).unwrap_or(&[])).collect()
}

/// Every mount of the volume `name`, in container order. The kubelet sets up only the volumes
/// a container mounts (pkg/volume/util `GetPodVolumeNames`).
pub fn mounts_of<'a>(pod: &'a Node, name: &str) -> Vec<Mount<'a>> {
    containers(pod)
        .into_iter()
        .flat_map(|c| {
            c.get("volumeMounts").map(Node::as_seq).unwrap_or(&[]).iter().map(move |m| Mount { container: c, mount: m })
        })
        .filter(|m| m.mount.get("name").and_then(Node::as_str) == Some(name))
        .collect()
}

/// A container's effective `runAsUser:runAsGroup` ("image default" when unset).
pub fn user_of(pod: &Node, c: &Node) -> String {
    let id = |key: &str| {
        c.at(&["securityContext", key])
            .or_else(|| pod.at(&["securityContext", key]))
            .and_then(Node::as_u64)
            .map_or("image default".to_string(), |n| n.to_string())
    };
    format!("{}:{}", id("runAsUser"), id("runAsGroup"))
}

/// True when the container runs as root (uid 0 set on it or on the pod): it keeps access to
/// any file whatever its group.
pub fn runs_as_root(pod: &Node, c: &Node) -> bool {
    c.at(&["securityContext", "runAsUser"]).or_else(|| pod.at(&["securityContext", "runAsUser"])).and_then(Node::as_u64)
        == Some(0)
}

#[cfg(test)]
mod tests {
    use super::super::parse::parse;
    use super::*;

    fn class(text: &str) -> Class {
        classify(&parse(text).unwrap()[0]).1
    }

    #[test]
    fn the_table() {
        assert_eq!(class("{name: a, emptyDir: {medium: Memory}}"), Class::Walked { empty_dir: true });
        assert_eq!(class("{name: a, persistentVolumeClaim: {claimName: c}}"), Class::Walked { empty_dir: false });
        assert_eq!(class("{name: a, persistentVolumeClaim: {claimName: c, readOnly: true}}"), Class::NotWalked);
        for disk in ["iscsi", "fc", "rbd", "awsElasticBlockStore", "gcePersistentDisk", "azureDisk", "cinder"] {
            assert_eq!(class(&format!("{{name: a, {disk}: {{fsType: ext4}}}}")), Class::Walked { empty_dir: false });
            assert_eq!(class(&format!("{{name: a, {disk}: {{readOnly: true}}}}")), Class::NotWalked, "{disk}");
        }
        assert_eq!(class("{name: a, csi: {driver: d}}"), Class::Driver);
        assert_eq!(class("{name: a, csi: {driver: d, readOnly: true}}"), Class::NotWalked);
        assert_eq!(class("{name: a, secret: {secretName: s}}"), Class::AtomicWriter);
        assert_eq!(class("{name: a, hostPath: {path: /x}}"), Class::NotWalked);
        assert_eq!(class("{name: a, futureVolume: {}}"), Class::Unknown);
    }
}
