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

{{/*
The defaults: values.yaml of this chart, key for key (tests/examples.rs checks it), for a map
that did not come through Helm's merge of this chart's values (a dependency without
`alias: volumePermissions`, or a map built in a template). See values.yaml for each key.
*/}}
{{- define "volprep.defaults" -}}
enabled: false
name: volprep
mode: root
runAsUser: null
runAsGroup: null
allowForeign: false
image:
  registry: ghcr.io
  repository: volprep/volprep
  tag: "0.1.0"
  digest: ""
  pullPolicy: IfNotPresent
  pullSecrets: []
fsGroup: null
owner: null
readOnly: false
modes: kubelet
appUid: null
rules: []
sticky: []
paths: []
volumeMounts: []
threads: 0
load: auto
maxOps: null
maxErrors: 0
logFormat: json
terminationLog: /dev/termination-log
report: ""
extraArgs: []
extraEnv: []
resourcesPreset: small
resources: {}
containerSecurityContext: {}
jobs: []
job:
  backoffLimit: 3
  activeDeadlineSeconds: null
  mountDir: /volumes
{{- end -}}

{{/* values over defaults, as YAML: top-level keys, image.* and job.* taken from values when present; "global" (Helm's, in a merged dependency's values) is left out. */}}
{{- define "volprep.values" -}}
{{- $defaults := include "volprep.defaults" . | fromYaml -}}
{{- $user := .values | default dict -}}
{{- range $k, $_ := $user -}}
{{- if not (or (hasKey $defaults $k) (eq $k "global")) -}}
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
{{- if not (hasKey $merged $k) -}}
{{- fail (printf "volumePermissions.%s.%s: unknown key (known: %s)" $map $k (keys $merged | sortAlpha | join ", ")) -}}
{{- end -}}
{{- $_ := set $merged $k $v -}}
{{- end -}}
{{- $_ := set $out $map $merged -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
A numeric id as written on the command line, from a value that may hold a number as a float or
a string: (dict "key" "fsGroup" "value" $v.fsGroup "kind" "GID"), where kind is GID, UID or
"UID or UID:GID". Anything else fails the render, naming the key and what it takes.
*/}}
{{- define "volprep.id" -}}
{{- $s := ternary .value (printf "%d" (.value | int64)) (kindIs "string" .value) -}}
{{- $pattern := ternary "^[0-9]+(:[0-9]+)?$" "^[0-9]+$" (eq .kind "UID or UID:GID") -}}
{{- if not (regexMatch $pattern $s) -}}
{{- if and (eq .kind "GID") (regexMatch "^[0-9]+:[0-9]+$" $s) -}}
{{- fail (printf "volumePermissions.%s: %q: a group is one GID" .key $s) -}}
{{- end -}}
{{- fail (printf "volumePermissions.%s: %q is not a numeric %s" .key $s .kind) -}}
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
{{- if not (has (toString $v.modes) (list "kubelet" "app-safe")) -}}
{{- fail (printf "volumePermissions.modes: %q is not a mode policy: kubelet or app-safe" (toString $v.modes)) -}}
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
{{- $gid := include "volprep.id" (dict "key" "fsGroup" "value" $v.fsGroup "kind" "GID") -}}
{{- $args = append $args (printf "--fs-group=%s" $gid) -}}
{{- end -}}
{{- if $owner -}}
{{- $args = append $args (printf "--owner=%s" (include "volprep.id" (dict "key" "owner" "value" $v.owner "kind" "UID or UID:GID"))) -}}
{{- end -}}
{{- if $v.readOnly -}}
{{- $args = append $args "--read-only" -}}
{{- end -}}
{{- if eq (toString $v.modes) "app-safe" -}}
{{- $args = append $args "--modes=app-safe" -}}
{{- if include "volprep.isSet" $v.appUid -}}
{{- $args = append $args (printf "--app-uid=%s" (include "volprep.id" (dict "key" "appUid" "value" $v.appUid "kind" "UID"))) -}}
{{- else if include "volprep.isSet" $v.runAsUser -}}
{{- $args = append $args (printf "--app-uid=%s" (include "volprep.id" (dict "key" "runAsUser" "value" $v.runAsUser "kind" "UID"))) -}}
{{- end -}}
{{- range $v.rules -}}
{{- $args = append $args (printf "--rule=%s" .) -}}
{{- end -}}
{{- else if $v.rules -}}
{{- fail "volumePermissions.rules are rules of modes app-safe: set modes: app-safe" -}}
{{- end -}}
{{- range $v.sticky -}}
{{- $args = append $args (printf "--sticky=%s" .) -}}
{{- end -}}
{{- if $v.threads -}}
{{- $args = append $args (printf "--threads=%d" ($v.threads | int64)) -}}
{{- end -}}
{{- $load := toString $v.load -}}
{{- if not (has $load (list "auto" "adaptive" "full")) -}}
{{- fail (printf "volumePermissions.load: %q is not auto, adaptive or full" $load) -}}
{{- end -}}
{{- if ne $load "auto" -}}
{{- $args = append $args (printf "--load=%s" $load) -}}
{{- end -}}
{{- if include "volprep.isSet" $v.maxOps -}}
{{- if lt ($v.maxOps | int64) 1 -}}
{{- fail (printf "volumePermissions.maxOps: %v: a ceiling is at least 1 operation per second (null: none)" $v.maxOps) -}}
{{- end -}}
{{- $args = append $args (printf "--max-ops=%d" ($v.maxOps | int64)) -}}
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
The container's securityContext: the mode's safe default with values.containerSecurityContext
merged over it, key by key. Mode root: root with CHOWN, DAC_OVERRIDE, FOWNER and FSETID, the
rest dropped. Mode unprivileged: the "restricted" Pod Security Standard's: the app's uid and
gid, runAsNonRoot, no capability. Both: no privilege escalation, a read-only root filesystem,
seccomp RuntimeDefault.
*/}}
{{- define "volprep.securityContext" -}}
{{- $v := include "volprep.values" . | fromYaml -}}
{{- $own := $v.containerSecurityContext | default dict -}}
{{- $base := dict -}}
{{- if include "volprep.unprivileged" . -}}
{{- $uid := "" -}}
{{- if hasKey $own "runAsUser" -}}
{{- $uid = include "volprep.id" (dict "key" "containerSecurityContext.runAsUser" "value" $own.runAsUser "kind" "UID") -}}
{{- else if include "volprep.isSet" $v.runAsUser -}}
{{- $uid = include "volprep.id" (dict "key" "runAsUser" "value" $v.runAsUser "kind" "UID") -}}
{{- else -}}
{{- fail "volumePermissions.mode unprivileged: set runAsUser (the app's uid)" -}}
{{- end -}}
{{- $gid := $uid -}}
{{- if include "volprep.isSet" $v.runAsGroup -}}{{- $gid = include "volprep.id" (dict "key" "runAsGroup" "value" $v.runAsGroup "kind" "GID") -}}{{- end -}}
{{- if or (contains ":" $uid) (contains ":" $gid) (eq $uid "0") -}}
{{- fail (printf "volumePermissions.runAsUser/runAsGroup: %s/%s: one non-root uid and one gid" $uid $gid) -}}
{{- end -}}
{{- $base = dict "runAsUser" ($uid | int64) "runAsGroup" ($gid | int64) "runAsNonRoot" true "capabilities" (dict "drop" (list "ALL")) -}}
{{- else -}}
{{- $base = dict "runAsUser" 0 "runAsGroup" 0 "runAsNonRoot" false "capabilities" (dict "drop" (list "ALL") "add" (list "CHOWN" "DAC_OVERRIDE" "FOWNER" "FSETID")) -}}
{{- end -}}
{{- $_ := set $base "privileged" false -}}
{{- $_ := set $base "allowPrivilegeEscalation" false -}}
{{- $_ := set $base "readOnlyRootFilesystem" true -}}
{{- $_ := set $base "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- toYaml (mergeOverwrite $base (deepCopy $own)) -}}
{{- end -}}

{{/*
The container's resources: values.resources when set, else the values.resourcesPreset
(none, nano, small, medium, large; see values.yaml).
*/}}
{{- define "volprep.resources" -}}
{{- $v := include "volprep.values" . | fromYaml -}}
{{- if $v.resources -}}
{{- toYaml $v.resources -}}
{{- else -}}
{{- $presets := dict
  "none" (dict)
  "nano" (dict "requests" (dict "cpu" "50m" "memory" "16Mi") "limits" (dict "cpu" "500m" "memory" "64Mi"))
  "small" (dict "requests" (dict "cpu" "100m" "memory" "32Mi") "limits" (dict "cpu" "1" "memory" "128Mi"))
  "medium" (dict "requests" (dict "cpu" "500m" "memory" "64Mi") "limits" (dict "cpu" "2" "memory" "256Mi"))
  "large" (dict "requests" (dict "cpu" "1" "memory" "128Mi") "limits" (dict "cpu" "4" "memory" "512Mi")) -}}
{{- $name := toString $v.resourcesPreset -}}
{{- if not (hasKey $presets $name) -}}
{{- fail (printf "volumePermissions.resourcesPreset: %q is none of: %s" $name (keys $presets | sortAlpha | join ", ")) -}}
{{- end -}}
{{- toYaml (get $presets $name) -}}
{{- end -}}
{{- end -}}

{{/*
The pod's imagePullSecrets (a YAML list of {name: ...}, empty when none): global.imagePullSecrets
then image.pullSecrets, each a name or {name: ...}, without repeats. The init container cannot
carry them: put the list in the pod spec, and no key at all when it is empty:

  {{- with include "volprep.imagePullSecrets" (dict "values" .Values.volumePermissions "context" $) | fromYamlArray }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
*/}}
{{- define "volprep.imagePullSecrets" -}}
{{- $v := include "volprep.values" . | fromYaml -}}
{{- $all := list -}}
{{- with .context -}}{{- with .Values.global -}}{{- with .imagePullSecrets -}}
{{- $all = concat $all . -}}
{{- end -}}{{- end -}}{{- end -}}
{{- $all = concat $all ($v.image.pullSecrets | default list) -}}
{{- $names := list -}}
{{- range $all -}}
{{- $name := toString . -}}
{{- if kindIs "map" . -}}{{- $name = toString .name -}}{{- end -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$" $name) -}}
{{- fail (printf "volumePermissions.image.pullSecrets: %q is not a Secret name" $name) -}}
{{- end -}}
{{- if not (has $name $names) -}}{{- $names = append $names $name -}}{{- end -}}
{{- end -}}
{{- $secrets := list -}}
{{- range $names -}}{{- $secrets = append $secrets (dict "name" .) -}}{{- end -}}
{{- toYaml $secrets -}}
{{- end -}}

{{/*
The pod's supplementalGroups entry that gives the app the group volprep set (a YAML list,
empty when disabled or without fsGroup). Use it instead of the pod's fsGroup: with fsGroup
the kubelet walks the whole volume itself at mount time, before any init container.
*/}}
{{- define "volprep.supplementalGroups" -}}
{{- $v := include "volprep.values" . | fromYaml -}}
{{- if and $v.enabled (include "volprep.isSet" $v.fsGroup) -}}
- {{ include "volprep.id" (dict "key" "fsGroup" "value" $v.fsGroup "kind" "GID") }}
{{- else -}}
[]
{{- end -}}
{{- end -}}

{{/*
The pod securityContext's group key, or nothing without fsGroup: supplementalGroups with the
fsGroup when volprep is enabled (not fsGroup: with it the kubelet walks the whole volume itself
before any init container), the pod's fsGroup when it is not (the kubelet's pass grants the
group then). One line; take it with `with`, so that nothing leaves no blank line:

  securityContext:
    {{- with include "volprep.podGroups" (dict "values" .Values.volumePermissions "context" $) }}{{ . | nindent 4 }}{{ end }}
*/}}
{{- define "volprep.podGroups" -}}
{{- $v := include "volprep.values" . | fromYaml -}}
{{- if include "volprep.isSet" $v.fsGroup -}}
{{- $gid := include "volprep.id" (dict "key" "fsGroup" "value" $v.fsGroup "kind" "GID") -}}
{{- if $v.enabled -}}
supplementalGroups: [{{ $gid }}]
{{- else -}}
fsGroup: {{ $gid }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The pod's imagePullSecrets key (volprep.imagePullSecrets as one line), or nothing when there are
none; take it with `with`, like volprep.podGroups.
*/}}
{{- define "volprep.podImagePullSecrets" -}}
{{- $secrets := include "volprep.imagePullSecrets" . | fromYamlArray -}}
{{- if $secrets -}}
imagePullSecrets: {{ toJson $secrets }}
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
    {{- include "volprep.resources" . | nindent 4 }}
  volumeMounts:
    {{- toYaml $v.volumeMounts | nindent 4 }}
{{- end }}
{{- end -}}
