{{/*
volprep.jobs: one Job per PVC of .Values.volumePermissions.jobs, for preparing many existing
volumes at once (after a storage migration, say). Takes the chart's root context:

  # templates/jobs.yaml of your chart
  {{- include "volprep.jobs" . }}

  # values.yaml
  volumePermissions:
    fsGroup: 2000               # every key of "volprep.defaults" is a default for all the Jobs
    jobs:
      - pvc: data-gitea-0       # mounted at /volumes/data-gitea-0
      - pvc: uploads
        owner: "1001:2000"      # per Job: pvc (required), name, fsGroup, owner, readOnly, modes, appUid, rules, args
    job:
      backoffLimit: 3

Each Job mounts its PVC at job.mountDir/<pvc> (/volumes/<pvc>) and runs `volprep apply` there
with the args the init container would get (spec, logFormat, report, terminationLog, extraArgs,
then the Job's own args). report defaults to "-" here: the JSON report goes to stdout, so
`kubectl logs` holds it, and the one-line summary to the termination message. Both name the
PVC by its path, so `volprep report merge` of all the Jobs' reports lists one line per PVC. Bad input (exit 2) fails the Job at once
through podFailurePolicy; an evicted pod is rerun without using a retry.

The Job is named volprep-<pvc> (shortened with a hash past 63 characters) unless name is set.
A PVC listed twice fails the render: two Jobs on one volume would only wait on each other.
*/}}
{{- define "volprep.jobs" -}}
{{- $root := . -}}
{{- $base := .Values.volumePermissions | default dict -}}
{{- $v := include "volprep.values" (dict "values" $base "context" $root) | fromYaml -}}
{{- $known := list "appUid" "args" "fsGroup" "modes" "name" "owner" "pvc" "readOnly" "rules" -}}
{{- $pvcs := list -}}
{{- $names := list -}}
{{- range $i, $job := $v.jobs }}
{{- $at := printf "volumePermissions.jobs[%d]" $i -}}
{{- if not (kindIs "map" $job) -}}
{{- fail (printf "%s: a map such as {pvc: data-app-0}" $at) -}}
{{- end -}}
{{- range $k, $_ := $job -}}
{{- if not (has $k $known) -}}
{{- fail (printf "%s.%s: unknown key (known: %s)" $at $k (join ", " $known)) -}}
{{- end -}}
{{- end -}}
{{- $pvc := $job.pvc | default "" | toString -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$" $pvc) -}}
{{- fail (printf "%s.pvc: %q is not a PVC name" $at $pvc) -}}
{{- end -}}
{{- if has $pvc $pvcs -}}
{{- fail (printf "%s.pvc: %s is listed twice" $at $pvc) -}}
{{- end -}}
{{- $pvcs = append $pvcs $pvc -}}
{{- $name := printf "volprep-%s" $pvc -}}
{{- if $job.name -}}
{{- $name = toString $job.name -}}
{{- else if gt (len $name) 63 -}}
{{- $name = printf "%s-%s" ($name | trunc 54 | trimSuffix "-" | trimSuffix ".") (sha256sum $pvc | trunc 8) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$" $name) -}}
{{- fail (printf "%s.name: %q is not a Job name (at most 63 characters)" $at $name) -}}
{{- end -}}
{{- if has $name $names -}}
{{- fail (printf "%s.name: two Jobs named %s" $at $name) -}}
{{- end -}}
{{- $names = append $names $name -}}
{{- if not (kindIs "slice" ($job.args | default list)) -}}
{{- fail (printf "%s.args: a list of arguments" $at) -}}
{{- end -}}
{{- /* This Job's values: the shared ones, its own spec, its PVC as the only path. */ -}}
{{- $jv := omit (deepCopy $base) "jobs" -}}
{{- range $k := list "appUid" "fsGroup" "modes" "owner" "readOnly" "rules" -}}
{{- if hasKey $job $k -}}{{- $_ := set $jv $k (get $job $k) -}}{{- end -}}
{{- end -}}
{{- range $k, $kind := dict "fsGroup" "GID" "owner" "UID or UID:GID" -}}
{{- if include "volprep.isSet" (get $job $k) -}}
{{- $_ := include "volprep.id" (dict "key" (printf "jobs[%d].%s" $i $k) "value" (get $job $k) "kind" $kind) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $jv "sticky" list -}}
{{- $mountPath := printf "%s/%s" ($v.job.mountDir | trimSuffix "/") $pvc -}}
{{- $_ := set $jv "paths" (list $mountPath) -}}
{{- $_ := set $jv "volumeMounts" (list (dict "name" "data" "mountPath" $mountPath)) -}}
{{- $_ := set $jv "extraArgs" (concat ($v.extraArgs | default list) ($job.args | default list)) -}}
{{- if not (or (include "volprep.isSet" (get $jv "fsGroup")) (include "volprep.isSet" (get $jv "owner"))) -}}
{{- fail (printf "%s (pvc %s): set fsGroup and/or owner, here or for all Jobs in volumePermissions" $at $pvc) -}}
{{- end -}}
{{- if not (hasKey $base "report") -}}{{- $_ := set $jv "report" "-" -}}{{- end -}}
{{- $ctx := dict "values" $jv "context" $root }}
---
apiVersion: batch/v1
kind: Job
metadata:
  name: {{ $name }}
  labels:
    app.kubernetes.io/name: volprep
    app.kubernetes.io/instance: {{ $root.Release.Name }}
    app.kubernetes.io/component: volume-permissions
    app.kubernetes.io/managed-by: {{ $root.Release.Service }}
    helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
spec:
  backoffLimit: {{ $v.job.backoffLimit | int64 }}
  {{- with $v.job.activeDeadlineSeconds }}
  activeDeadlineSeconds: {{ . | int64 }}
  {{- end }}
  podFailurePolicy:
    rules:
      # Exit 2 is a usage error (bad flag or id): every retry would fail the same way.
      - action: FailJob
        onExitCodes:
          containerName: {{ $v.name }}
          operator: In
          values: [2]
      # Eviction, preemption, node drain: rerun without counting against backoffLimit.
      - action: Ignore
        onPodConditions:
          - type: DisruptionTarget
            status: "True"
  template:
    metadata:
      labels:
        app.kubernetes.io/name: volprep
        app.kubernetes.io/instance: {{ $root.Release.Name }}
        app.kubernetes.io/component: volume-permissions
    spec:
      # podFailurePolicy requires Never.
      restartPolicy: Never
      automountServiceAccountToken: false
      {{- $secrets := include "volprep.imagePullSecrets" $ctx | fromYamlArray }}
      {{- if $secrets }}
      imagePullSecrets:
        {{- toYaml $secrets | nindent 8 }}
      {{- end }}
      # No fsGroup: with it the kubelet would walk the volume itself before volprep starts.
      containers:
        - name: {{ $v.name }}
          image: {{ include "volprep.image" $ctx | quote }}
          imagePullPolicy: {{ $v.image.pullPolicy }}
          args:
            {{- include "volprep.args" $ctx | nindent 12 }}
          {{- with $v.extraEnv }}
          env:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          terminationMessagePolicy: FallbackToLogsOnError
          securityContext:
            {{- include "volprep.securityContext" $ctx | nindent 12 }}
          resources:
            {{- include "volprep.resources" $ctx | nindent 12 }}
          volumeMounts:
            - name: data
              mountPath: {{ $mountPath }}
      volumes:
        - name: data
          persistentVolumeClaim:
            claimName: {{ $pvc }}
{{- end }}
{{- end -}}
