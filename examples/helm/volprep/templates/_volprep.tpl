{{/*
volprep library chart.

Every template takes a dict:
  values   the app chart's volumePermissions map (see "volprep.defaults" for its keys)
  context  the app chart's root context ($), for .Values.global.imageRegistry

  initContainers:
    {{- include "volprep.initContainer" (dict "values" .Values.volumePermissions "context" $) | nindent 4 }}

Keys missing from values take the defaults below. Unknown keys are an error, so a typo such as
`fsgroup` fails the render instead of silently preparing nothing.
*/}}

{{/* The defaults, Bitnami volumePermissions style. */}}
{{- define "volprep.defaults" -}}
enabled: false
name: volprep
# root: a root init container with four capabilities (securityContext below); it fixes every
# entry. unprivileged: it runs as the app's user (runAsUser) with no capability at all and
# meets the "restricted" Pod Security Standard; it fixes the entries that user owns and lists
# the others (exit 4 until a privileged run, e.g. "volprep.jobs", fixes them). The pod must
# give the app fsGroup through supplementalGroups ("volprep.supplementalGroups"); owner and
# sticky need root.
mode: root
# mode unprivileged: the app's uid (required, not 0) and gid (default: runAsUser).
runAsUser: null
runAsGroup: null
# mode unprivileged: let the pod start (exit 0, not 4) when entries of other users are left, e.g.
# the root-owned lost+found of a fresh ext4 volume; they are still listed and warned about
# (--allow-foreign).
allowForeign: false
image:
  registry: registry.example.com
  repository: volprep
  tag: "0.1.0"
  digest: ""
  pullPolicy: IfNotPresent
# Group every entry gets, with the kubelet's fsGroup mode policy (--fs-group).
fsGroup: null
# "UID[:GID]" every entry gets, like chown -R (--owner).
owner: null
# Read-only mode policy (0440 files instead of 0660); needs fsGroup (--read-only).
readOnly: false
# Directories made shared temp dirs, mode 01777, not recursive (--sticky), e.g. [/tmp].
sticky: []
# Volume roots to prepare; default: each volumeMounts mountPath not listed in sticky.
paths: []
# Mounts of the init container: every volume it prepares, sticky dirs included.
volumeMounts: []
# 0: volprep's automatic choice (--threads).
threads: 0
# Per-entry errors tolerated before the container fails (--max-errors).
maxErrors: 0
# text or json (--log-format).
logFormat: json
# Where volprep writes its one-line summary for `kubectl describe pod`; "" for none.
terminationLog: /dev/termination-log
# Where the JSON report goes (--report): a file, or "-" for stdout; "" for none. The Jobs of
# "volprep.jobs" default to "-", so `kubectl logs` holds each Job's report.
report: ""
extraArgs: []
extraEnv: []
resources:
  requests:
    cpu: 100m
    memory: 32Mi
  limits:
    cpu: "1"
    memory: 128Mi
# Replaces this default as a whole (in both modes; mode unprivileged without it gets runAsUser,
# runAsGroup, runAsNonRoot, drop ALL, no privilege escalation, seccomp RuntimeDefault and a
# read-only root filesystem). Root with four capabilities: CHOWN (change the group),
# FOWNER (chmod/chown other users' entries), FSETID (keep setgid on directories whose group
# the caller is not in), DAC_OVERRIDE (enter 0700 directories of other users, write the marker
# xattr on the root; DAC_READ_SEARCH misses the latter and is outside the "baseline" Pod
# Security Standard).
securityContext:
  runAsUser: 0
  runAsGroup: 0
  runAsNonRoot: false
  privileged: false
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: [ALL]
    add: [CHOWN, DAC_OVERRIDE, FOWNER, FSETID]
  seccompProfile:
    type: RuntimeDefault
# Jobs rendered by "volprep.jobs" (see _jobs.tpl), one per PVC: {pvc, name, fsGroup, owner,
# readOnly, args}. The init container ignores them.
jobs: []
# Settings of those Jobs.
job:
  # Retries of a failed pod; a usage error (exit 2) fails the Job at once, an eviction is free.
  backoffLimit: 3
  # Seconds before a running Job is stopped; null for no limit.
  activeDeadlineSeconds: null
  # Each PVC is mounted at mountDir/<pvc>, so summaries and reports name it.
  mountDir: /volumes
{{- end -}}

{{/* values over defaults, as YAML: top-level keys, image.* and job.* taken from values when present. */}}
{{- define "volprep.values" -}}
{{- $defaults := include "volprep.defaults" . | fromYaml -}}
{{- $user := .values | default dict -}}
{{- range $k, $_ := $user -}}
{{- if not (hasKey $defaults $k) -}}
{{- fail (printf "volumePermissions.%s: unknown key (known: %s)" $k (keys $defaults | sortAlpha | join ", ")) -}}
{{- end -}}
{{- end -}}
{{- $out := dict -}}
{{- range $k, $d := $defaults -}}
{{- if hasKey $user $k -}}
{{- $_ := set $out $k (get $user $k) -}}
{{- else -}}
{{- $_ := set $out $k $d -}}
{{- end -}}
{{- end -}}
{{- range $map := list "image" "job" -}}
{{- $merged := deepCopy (get $defaults $map) -}}
{{- range $k, $v := (get $user $map | default dict) -}}
{{- if and (eq $map "job") (not (hasKey $merged $k)) -}}
{{- fail (printf "volumePermissions.%s.%s: unknown key (known: %s)" $map $k (keys $merged | sortAlpha | join ", ")) -}}
{{- end -}}
{{- $_ := set $merged $k $v -}}
{{- end -}}
{{- $_ := set $out $map $merged -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
A numeric id, or "UID:GID", as written on the command line (values may hold a number as a
float or a string). Anything else fails the render.
*/}}
{{- define "volprep.id" -}}
{{- $s := ternary . (printf "%d" (. | int64)) (kindIs "string" .) -}}
{{- if not (regexMatch "^[0-9]+(:[0-9]+)?$" $s) -}}
{{- fail (printf "volumePermissions: %q is not a numeric id (UID or UID:GID)" $s) -}}
{{- end -}}
{{- $s -}}
{{- end -}}

{{/* True ("true") when v is set: not null and not "". */}}
{{- define "volprep.isSet" -}}
{{- if not (or (kindIs "invalid" .) (and (kindIs "string" .) (eq . ""))) -}}true{{- end -}}
{{- end -}}

{{/* registry/repository:tag@digest; .Values.global.imageRegistry wins over image.registry. */}}
{{- define "volprep.image" -}}
{{- $v := include "volprep.values" . | fromYaml -}}
{{- $registry := $v.image.registry -}}
{{- with .context -}}{{- with .Values.global -}}{{- with .imageRegistry -}}
{{- $registry = . -}}
{{- end -}}{{- end -}}{{- end -}}
{{- $ref := $v.image.repository -}}
{{- if $registry -}}{{- $ref = printf "%s/%s" $registry $ref -}}{{- end -}}
{{- if $v.image.tag -}}{{- $ref = printf "%s:%v" $ref $v.image.tag -}}{{- end -}}
{{- if $v.image.digest -}}{{- $ref = printf "%s@%s" $ref $v.image.digest -}}{{- end -}}
{{- $ref -}}
{{- end -}}

{{/* The volume roots: values.paths, or the mountPaths that are not sticky. */}}
{{- define "volprep.paths" -}}
{{- $v := include "volprep.values" . | fromYaml -}}
{{- $paths := $v.paths | default list -}}
{{- if not $paths -}}
{{- range ($v.volumeMounts | default list) -}}
{{- if not (has .mountPath ($v.sticky | default list)) -}}
{{- $paths = append $paths .mountPath -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $paths -}}
{{- end -}}

{{/* The container's args (a YAML list): the subcommand, spec, options, extraArgs, paths. */}}
{{- define "volprep.args" -}}
{{- $v := include "volprep.values" . | fromYaml -}}
{{- $fsGroup := include "volprep.isSet" $v.fsGroup -}}
{{- $owner := include "volprep.isSet" $v.owner -}}
{{- if not (or $fsGroup $owner) -}}
{{- fail "volumePermissions: set fsGroup (the app's group) and/or owner (\"UID[:GID]\")" -}}
{{- end -}}
{{- if and $v.readOnly (not $fsGroup) -}}
{{- fail "volumePermissions.readOnly changes the fsGroup mode policy: it needs fsGroup" -}}
{{- end -}}
{{- $paths := include "volprep.paths" . | fromYamlArray -}}
{{- if and (not $paths) (not $v.sticky) -}}
{{- fail "volumePermissions: nothing to prepare: set volumeMounts (or paths)" -}}
{{- end -}}
{{- $args := list "apply" -}}
{{- if include "volprep.unprivileged" . -}}
{{- if $owner -}}
{{- fail "volumePermissions.owner needs mode root: only root may give files away" -}}
{{- end -}}
{{- if $v.sticky -}}
{{- fail "volumePermissions.sticky needs mode root: the kubelet makes emptyDirs root's, and only their owner may chmod them" -}}
{{- end -}}
{{- if not $fsGroup -}}
{{- fail "volumePermissions.mode unprivileged: set fsGroup (the app's group, also in the pod's supplementalGroups)" -}}
{{- end -}}
{{- $args = append $args "--unprivileged" -}}
{{- if $v.allowForeign -}}
{{- $args = append $args "--allow-foreign" -}}
{{- end -}}
{{- else if $v.allowForeign -}}
{{- fail "volumePermissions.allowForeign is for mode unprivileged: a root run leaves nothing" -}}
{{- end -}}
{{- if $fsGroup -}}
{{- $gid := include "volprep.id" $v.fsGroup -}}
{{- if contains ":" $gid -}}
{{- fail (printf "volumePermissions.fsGroup: %q: a group is one GID" $gid) -}}
{{- end -}}
{{- $args = append $args (printf "--fs-group=%s" $gid) -}}
{{- end -}}
{{- if $owner -}}
{{- $args = append $args (printf "--owner=%s" (include "volprep.id" $v.owner)) -}}
{{- end -}}
{{- if $v.readOnly -}}
{{- $args = append $args "--read-only" -}}
{{- end -}}
{{- range $v.sticky -}}
{{- $args = append $args (printf "--sticky=%s" .) -}}
{{- end -}}
{{- if $v.threads -}}
{{- $args = append $args (printf "--threads=%d" ($v.threads | int64)) -}}
{{- end -}}
{{- if $v.maxErrors -}}
{{- $args = append $args (printf "--max-errors=%d" ($v.maxErrors | int64)) -}}
{{- end -}}
{{- with $v.logFormat -}}
{{- $args = append $args (printf "--log-format=%s" .) -}}
{{- end -}}
{{- with $v.report -}}
{{- $args = append $args (printf "--report=%s" .) -}}
{{- end -}}
{{- with $v.terminationLog -}}
{{- $args = append $args (printf "--termination-log=%s" .) -}}
{{- end -}}
{{- range $v.extraArgs -}}
{{- $args = append $args (toString .) -}}
{{- end -}}
{{- range $paths -}}
{{- $args = append $args . -}}
{{- end -}}
{{- toYaml $args -}}
{{- end -}}

{{/* "true" when mode is unprivileged; fails on a mode that is neither root nor unprivileged. */}}
{{- define "volprep.unprivileged" -}}
{{- $v := include "volprep.values" . | fromYaml -}}
{{- $mode := toString $v.mode -}}
{{- if not (has $mode (list "root" "unprivileged")) -}}
{{- fail (printf "volumePermissions.mode: %q is neither root nor unprivileged" $mode) -}}
{{- end -}}
{{- if eq $mode "unprivileged" -}}true{{- end -}}
{{- end -}}

{{/*
The container's securityContext: values.securityContext when given; else, for mode root, its
default; for mode unprivileged, the "restricted" Pod Security Standard's: the app's uid and gid,
runAsNonRoot, no capability, no privilege escalation, seccomp RuntimeDefault.
*/}}
{{- define "volprep.securityContext" -}}
{{- $v := include "volprep.values" . | fromYaml -}}
{{- if and (include "volprep.unprivileged" .) (not (hasKey (.values | default dict) "securityContext")) -}}
{{- if not (include "volprep.isSet" $v.runAsUser) -}}
{{- fail "volumePermissions.mode unprivileged: set runAsUser (the app's uid)" -}}
{{- end -}}
{{- $uid := include "volprep.id" $v.runAsUser -}}
{{- $gid := $uid -}}
{{- if include "volprep.isSet" $v.runAsGroup -}}{{- $gid = include "volprep.id" $v.runAsGroup -}}{{- end -}}
{{- if or (contains ":" $uid) (contains ":" $gid) (eq $uid "0") -}}
{{- fail (printf "volumePermissions.runAsUser/runAsGroup: %s/%s: one non-root uid and one gid" $uid $gid) -}}
{{- end -}}
runAsUser: {{ $uid }}
runAsGroup: {{ $gid }}
runAsNonRoot: true
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- else -}}
{{- toYaml $v.securityContext -}}
{{- end -}}
{{- end -}}

{{/*
The pod's supplementalGroups entry that gives the app the group volprep set (a YAML list,
empty when disabled or without fsGroup). Use it instead of the pod's fsGroup: with fsGroup
the kubelet walks the whole volume itself at mount time, before any init container.
*/}}
{{- define "volprep.supplementalGroups" -}}
{{- $v := include "volprep.values" . | fromYaml -}}
{{- if and $v.enabled (include "volprep.isSet" $v.fsGroup) -}}
- {{ include "volprep.id" $v.fsGroup }}
{{- else -}}
[]
{{- end -}}
{{- end -}}

{{/* The init container, as one list item; nothing when values.enabled is false. */}}
{{- define "volprep.initContainer" -}}
{{- $v := include "volprep.values" . | fromYaml -}}
{{- if $v.enabled -}}
- name: {{ $v.name }}
  image: {{ include "volprep.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  args:
    {{- include "volprep.args" . | nindent 4 }}
  {{- with $v.extraEnv }}
  env:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  terminationMessagePolicy: FallbackToLogsOnError
  securityContext:
    {{- include "volprep.securityContext" . | nindent 4 }}
  resources:
    {{- toYaml $v.resources | nindent 4 }}
  volumeMounts:
    {{- toYaml $v.volumeMounts | nindent 4 }}
{{- end }}
{{- end -}}
