{{- define "demo-app.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "demo-app.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "demo-app.labels" -}}
{{ include "demo-app.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/*
The volumePermissions values completed with what this chart knows: its volume mounts, the
group from podSecurityContext.fsGroup when neither fsGroup nor owner is given, and in mode
unprivileged the app's uid and gid from podSecurityContext (and no sticky /tmp).
*/}}
{{- define "demo-app.volumePermissions" -}}
{{- $vp := deepCopy (.Values.volumePermissions | default dict) -}}
{{- $unprivileged := eq (toString $vp.mode) "unprivileged" -}}
{{- if $unprivileged -}}
{{- /* The app's own user; /tmp stays as the kubelet makes it (only root may chmod an emptyDir). */ -}}
{{- if not (hasKey $vp "runAsUser") -}}{{- $_ := set $vp "runAsUser" .Values.podSecurityContext.runAsUser -}}{{- end -}}
{{- if not (hasKey $vp "runAsGroup") -}}{{- $_ := set $vp "runAsGroup" .Values.podSecurityContext.runAsGroup -}}{{- end -}}
{{- if eq (toJson ($vp.sticky | default list)) "[\"/tmp\"]" -}}{{- $_ := set $vp "sticky" list -}}{{- end -}}
{{- end -}}
{{- if not $vp.volumeMounts -}}
{{- $mounts := list (dict "name" "data" "mountPath" .Values.persistence.mountPath) -}}
{{- if not $unprivileged -}}{{- $mounts = append $mounts (dict "name" "tmp" "mountPath" "/tmp") -}}{{- end -}}
{{- $_ := set $vp "volumeMounts" $mounts -}}
{{- end -}}
{{- if and (not (include "volprep.isSet" $vp.fsGroup)) (not (include "volprep.isSet" $vp.owner)) -}}
{{- $_ := set $vp "fsGroup" .Values.podSecurityContext.fsGroup -}}
{{- end -}}
{{- toYaml $vp -}}
{{- end -}}

{{/* The pod securityContext: fsGroup moved to supplementalGroups when volprep runs. */}}
{{- define "demo-app.podSecurityContext" -}}
{{- $psc := deepCopy (.Values.podSecurityContext | default dict) -}}
{{- $vp := include "demo-app.volumePermissions" . | fromYaml -}}
{{- if $vp.enabled -}}
{{- $psc = omit $psc "fsGroup" "fsGroupChangePolicy" -}}
{{- $groups := include "volprep.supplementalGroups" (dict "values" $vp "context" .) | fromYamlArray -}}
{{- range ($psc.supplementalGroups | default list) -}}
{{- if not (has . $groups) -}}{{- $groups = append $groups . -}}{{- end -}}
{{- end -}}
{{- if $groups -}}{{- $_ := set $psc "supplementalGroups" $groups -}}{{- end -}}
{{- end -}}
{{- toYaml $psc -}}
{{- end -}}
