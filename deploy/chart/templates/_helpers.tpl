{{/* Names: release-prefixed, 63 characters at most (DNS label). */}}
{{- define "nvdaemon.name" -}}
{{- if include "nvdaemon.goNames" . -}}nodevitals
{{- else -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
"true" when the Go chart's names are rendered (goNames: true, or auto with the release named nodevitals, as the Go
quickstart's `helm install nodevitals` names it): every resource named as the Go chart names it whatever the release
(nodevitals-core, -smart, -gpu, nodevitals for singlePod, nodevitals-webhooks, nodevitals-metrics, the ServiceMonitor
nodevitals), app.kubernetes.io/name nodevitals, and selectors of exactly the Go chart's labels (name and component,
no instance): a DaemonSet's selector is immutable, so an in-place `helm upgrade` of a Go release needs the same one.
nameOverride and fullnameOverride are then unused.
*/}}
{{- define "nvdaemon.goNames" -}}
{{- $set := toString .Values.goNames -}}
{{- if or (eq $set "true") (and (ne $set "false") (eq .Release.Name "nodevitals")) -}}true{{- end -}}
{{- end -}}

{{- define "nvdaemon.fullname" -}}
{{- if include "nvdaemon.goNames" . -}}nodevitals
{{- else if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "nvdaemon.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nvdaemon.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nvdaemon.name" . }}
{{- if not (include "nvdaemon.goNames" .) }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
{{- end -}}

{{- define "nvdaemon.labels" -}}
helm.sh/chart: {{ include "nvdaemon.chart" . }}
{{ include "nvdaemon.selectorLabels" . }}
{{- if include "nvdaemon.goNames" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nvdaemon
{{- end -}}

{{- define "nvdaemon.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "nvdaemon.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The agent's image. The Go chart's repository (what a copied Go values file names) cannot run this chart's config:
it stands for "the chart's own agent", so this chart's default repository at appVersion is used instead (its tag,
if any, named a Go release).
*/}}
{{- define "nvdaemon.goImage" -}}
{{- if eq (lower .Values.image.repository) "ghcr.io/keiailab/nodevitals" -}}true{{- end -}}
{{- end -}}

{{- define "nvdaemon.image" -}}
{{- if include "nvdaemon.goImage" . -}}
{{- printf "ghcr.io/nvdaemon/nvdaemon:%s" .Chart.AppVersion -}}
{{- else if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The DaemonSets to render, as YAML: a list of {name, component, state, tiers, hostMounts, nodeExporter, root, gpu,
gpuOnly, hostNetwork}, one per enabled tier, or one holding every enabled tier with singlePod. What the tiers need of
the node is decided here for the DaemonSet, the agent's config and NOTES alike: hostMounts, the host's /proc and
/sys (core, smart); nodeExporter, the node_exporter drop-in, whose collectors run in the core tier only (the smart
and gpu pods get neither its config nor the host's / mounted); root, for smartctl; gpuOnly, the only case that pins
the pods to GPU nodes (singlePod on a mixed fleet keeps one pod on every node); hostNetwork, for the core pod
(tiers.core.hostNetwork), the core or singlePod pod (the Go chart's hostNetwork) and forced by nodeExporter; kmsg,
for the one pod that reads the kernel log (nvdaemon.kmsgTier).
*/}}
{{- define "nvdaemon.groups" -}}
{{- $enabled := list -}}
{{- range $tier := list "core" "smart" "gpu" -}}
{{- if (index $.Values.tiers $tier).enabled -}}
{{- $enabled = append $enabled $tier -}}
{{- end -}}
{{- end -}}
{{- $sets := list -}}
{{- if $.Values.singlePod -}}
{{- if $enabled -}}
{{- $sets = append $sets (dict "suffix" "" "component" (ternary "single" "agent" (not (empty (include "nvdaemon.goNames" $)))) "state" "all" "tiers" $enabled) -}}
{{- end -}}
{{- else -}}
{{- range $tier := $enabled -}}
{{- $sets = append $sets (dict "suffix" (printf "-%s" $tier) "component" $tier "state" $tier "tiers" (list $tier)) -}}
{{- end -}}
{{- end -}}
{{- $kmsgTier := include "nvdaemon.kmsgTier" $ -}}
{{- $groups := list -}}
{{- range $g := $sets -}}
{{- $tiers := $g.tiers -}}
{{- $groups = append $groups (dict
  "name" (printf "%s%s" (include "nvdaemon.fullname" $) $g.suffix)
  "component" $g.component
  "state" $g.state
  "tiers" $tiers
  "hostMounts" (or (has "core" $tiers) (has "smart" $tiers))
  "nodeExporter" (and $.Values.nodeExporter.enabled (has "core" $tiers))
  "root" (has "smart" $tiers)
  "gpu" (has "gpu" $tiers)
  "gpuOnly" (eq (toJson $tiers) (toJson (list "gpu")))
  "kmsg" (and (ne $kmsgTier "") (has $kmsgTier $tiers))
  "hostNetwork" (or
    (and (has "core" $tiers) $.Values.tiers.core.hostNetwork)
    (and (or (has "core" $tiers) $.Values.singlePod) $.Values.hostNetwork)
    (and $.Values.nodeExporter.enabled (has "core" $tiers)))) -}}
{{- end -}}
{{- dict "groups" $groups | toYaml -}}
{{- end -}}

{{/*
The tier whose pod reads the kernel log (/dev/kmsg), or "" when kernelLog.enabled is false or no tier is enabled: the
one that is named, or for auto gpu (an XID is merged with NVML's report, and mapped to its GPU, only in the process
that runs NVML), else smart, else core. With singlePod every enabled tier is in the one pod, so that pod reads it.
A named tier that is not enabled fails the install: no pod would read it.
*/}}
{{- define "nvdaemon.kmsgTier" -}}
{{- $kl := .Values.kernelLog -}}
{{- if $kl.enabled -}}
{{- $pod := default "auto" $kl.pod -}}
{{- if eq $pod "auto" -}}
{{- range $tier := list "gpu" "smart" "core" -}}
{{- if and (eq $pod "auto") (index $.Values.tiers $tier).enabled -}}{{- $pod = $tier -}}{{- end -}}
{{- end -}}
{{- if ne $pod "auto" -}}{{- $pod -}}{{- end -}}
{{- else if (index .Values.tiers $pod).enabled -}}
{{- $pod -}}
{{- else -}}
{{- fail (printf "kernelLog.pod is %s, but tiers.%s.enabled is false: no pod would read /dev/kmsg. Enable that tier, or set kernelLog.pod to auto or an enabled tier" $pod $pod) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Secret holding the inline webhook secrets (and nothing else). */}}
{{- define "nvdaemon.secretName" -}}
{{- printf "%s-webhooks" (include "nvdaemon.fullname" .) -}}
{{- end -}}

{{/* The key of webhook <index>'s inline secret: the Go chart's secret-<i> with goNames (a Go pod that restarts
during the rollout still finds its key), else webhook-<i>. (. = dict "root" $ "index" i) */}}
{{- define "nvdaemon.secretKey" -}}
{{- printf "%s-%d" (ternary "secret" "webhook" (not (empty (include "nvdaemon.goNames" .root)))) (int .index) -}}
{{- end -}}

{{- define "nvdaemon.secretData" -}}
{{- $data := dict -}}
{{- range $i, $hook := .Values.webhooks -}}
{{- if and $hook.secret (not $hook.existingSecret) -}}
{{- $_ := set $data (include "nvdaemon.secretKey" (dict "root" $ "index" $i)) ($hook.secret | b64enc) -}}
{{- end -}}
{{- end -}}
{{- if $data -}}
{{- toYaml $data -}}
{{- end -}}
{{- end -}}

{{/*
What the pods read from Secrets: the inline data and the references to existing Secrets. Its hash is the
checksum/secret annotation, so changing a secret (or pointing at another Secret) rolls the pods.
*/}}
{{- define "nvdaemon.secretInputs" -}}
{{- $refs := list -}}
{{- range $i, $hook := .Values.webhooks -}}
{{- if $hook.existingSecret -}}
{{- $refs = append $refs (printf "%d=%s/%s" $i $hook.existingSecret.name $hook.existingSecret.key) -}}
{{- end -}}
{{- end -}}
{{- if .Values.metrics.apiToken.existingSecret -}}
{{- $refs = append $refs (printf "apiToken=%s/%s" .Values.metrics.apiToken.existingSecret .Values.metrics.apiToken.key) -}}
{{- end -}}
data: {{ include "nvdaemon.secretData" . | fromYaml | toJson }}
refs: {{ toJson $refs }}
{{- end -}}

{{/* The agent's config for one group (. = dict "root" $ "group" $group), as a dict. */}}
{{- define "nvdaemon.config" -}}
{{- $v := .root.Values -}}
{{- $tiers := .group.tiers -}}
{{- $cfg := dict "tiers" $tiers "intervalSeconds" $v.intervalSeconds "shutdownGraceSeconds" $v.shutdownGraceSeconds "stateDir" "/var/lib/nvdaemon" -}}
{{- $rules := list -}}
{{- if has "core" $tiers -}}{{- $rules = concat $rules $v.rules -}}{{- end -}}
{{- if has "smart" $tiers -}}{{- $rules = concat $rules $v.smartRules -}}{{- end -}}
{{- if has "gpu" $tiers -}}{{- $rules = concat $rules $v.gpuRules -}}{{- end -}}
{{- if $rules -}}{{- $_ := set $cfg "rules" $rules -}}{{- end -}}{{/* none: the key is left out (an empty list would render as null) */}}
{{- if .group.hostMounts -}}
{{- $_ := set $cfg "procRoot" "/host/proc" -}}
{{- $_ := set $cfg "sysRoot" "/host/sys" -}}
{{- end -}}
{{- if has "smart" $tiers -}}
{{- $_ := set $cfg "devRoot" "/host/dev" -}}
{{- $_ := set $cfg "smart" (deepCopy $v.smart) -}}
{{- end -}}
{{- if has "gpu" $tiers -}}
{{- $_ := set $cfg "gpu" (deepCopy $v.gpu) -}}
{{- end -}}
{{- if $v.history.enabled -}}
{{- $history := omit $v.history "hostPath" "mountPath" "chownImage" -}}{{/* the chart's: where the store is mounted */}}
{{- $_ := set $history "dataDir" $v.history.mountPath -}}
{{- $_ := set $cfg "history" (deepCopy $history) -}}
{{- end -}}
{{- if .group.nodeExporter -}}
{{- $ne := pick $v.nodeExporter "enabled" "diskstats" "filesystem" "netdev" "hwmon" -}}{{/* only the keys set: the agent's defaults apply */}}
{{- range $key := list "diskstats" "filesystem" "netdev" "hwmon" -}}
{{- if not (index $ne $key) -}}{{- $ne = omit $ne $key -}}{{- end -}}
{{- end -}}
{{- with $v.nodeExporter.collectors -}}{{- $_ := set $ne "collectors" . -}}{{- end -}}
{{- with include "nvdaemon.textfileDirectory" .root -}}{{- $_ := set $ne "textfileDirectory" . -}}{{- end -}}
{{- with $v.nodeExporter.extraFlags -}}{{- $_ := set $ne "extraFlags" . -}}{{- end -}}
{{- /* The host's / (filesystem statfs, os-release, udev data), as the Go chart renders it; "" without the mount:
     the filesystem collector is off, since the container's own mounts are not the node's disks. */ -}}
{{- $_ := set $ne "rootfsPath" (ternary "/host/root" "" (not (empty $v.nodeExporter.mountRootFS))) -}}
{{- $_ := set $cfg "nodeExporter" (deepCopy $ne) -}}
{{- end -}}
{{- $dcgm := dict -}}
{{- if $v.dcgmCompat.enabled -}}{{- $_ := set $dcgm "enabled" true -}}{{- end -}}
{{- if and .group.gpu $v.dcgmCompat.podAttribution -}}{{/* the socket in the pod-resources mount (daemonset.yaml) */}}
{{- $_ := set $dcgm "podAttribution" true -}}
{{- $_ := set $dcgm "podResourcesSocket" "/var/lib/kubelet/pod-resources/kubelet.sock" -}}
{{- with $v.dcgmCompat.podResourcesTimeoutSeconds -}}{{- $_ := set $dcgm "podResourcesTimeoutSeconds" . -}}{{- end -}}
{{- end -}}
{{- if $dcgm -}}{{- $_ := set $cfg "dcgmCompat" $dcgm -}}{{- end -}}
{{- if $v.smartctlCompat.enabled -}}{{- $_ := set $cfg "smartctlCompat" (dict "enabled" true) -}}{{- end -}}
{{- if .group.kmsg -}}
{{- /* devRoot/kmsg: the host's /dev (smart) or its /dev/kmsg alone (daemonset.yaml) at /host/dev */ -}}
{{- $_ := set $cfg "devRoot" "/host/dev" -}}
{{- $kl := pick $v.kernelLog "lookbackSeconds" "maxRecordsPerSecond" "maxRecordBytes" "xidMergeSeconds" "xidRepeatSeconds" "defaultRules" -}}
{{- $_ := set $kl "enabled" true -}}
{{- $_ := set $cfg "kernelLog" (deepCopy $kl) -}}
{{- with $v.kernelLog.rules -}}{{- $_ := set $cfg "kernelRules" (deepCopy .) -}}{{- end -}}
{{- else -}}
{{- /* the agent's default is on: a pod not meant to read it must not report it unreadable */ -}}
{{- $_ := set $cfg "kernelLog" (dict "enabled" false) -}}
{{- end -}}
{{- $sinks := dict "metrics" (dict "enabled" true "listenAddr" (printf "%s:%d" (include "nvdaemon.bindHost" $v.metrics.bindAddress) (int $v.metrics.port))) -}}
{{- $hooks := list -}}
{{- range $i, $hook := $v.webhooks -}}
{{- $entry := omit $hook "secret" "existingSecret" -}}
{{- if or $hook.secret $hook.existingSecret -}}
{{- $_ := set $entry "secret" (printf "${WEBHOOK_SECRET_%d}" $i) -}}
{{- end -}}
{{- $hooks = append $hooks $entry -}}
{{- end -}}
{{- if $hooks -}}{{- $_ := set $sinks "webhook" $hooks -}}{{- end -}}
{{- if $v.nvsentinel.enabled -}}
{{- $nv := dict "enabled" true "agent" $v.nvsentinel.agent "processingStrategy" $v.nvsentinel.processingStrategy "healthyBaseline" $v.nvsentinel.healthyBaseline -}}
{{- $_ := set $nv "socketPath" (printf "/var/run/nvsentinel/%s" $v.nvsentinel.socketName) -}}
{{- $_ := set $nv "tokenPath" "/var/run/secrets/nvsentinel/platform-connector/token" -}}
{{- if $v.nvsentinel.xidActions -}}{{- $_ := set $nv "xidActions" $v.nvsentinel.xidActions -}}{{- end -}}
{{- $_ := set $sinks "nvsentinel" $nv -}}
{{- end -}}
{{- $_ := set $cfg "sinks" $sinks -}}
{{- if $v.metrics.apiToken.existingSecret -}}
{{- $_ := set $cfg "server" (dict "apiTokenFile" "/var/run/secrets/nvdaemon/api-token/token") -}}
{{- end -}}
{{- toYaml (mustMergeOverwrite $cfg (deepCopy $v.extraConfig)) -}}
{{- end -}}

{{/* A path the pod mounts ({key, dir}) must not shadow, or be shadowed by, a path the chart mounts itself. */}}
{{- define "nvdaemon.ownPath" -}}
{{- $dir := .dir -}}
{{- range $own := list "/etc/nvdaemon" "/var/lib/nvdaemon" "/tmp" "/host" "/var/run/nvsentinel" "/var/run/secrets" "/run/udev" -}}
{{- if or (eq $dir $own) (hasPrefix (printf "%s/" $own) $dir) (hasPrefix (printf "%s/" $dir) $own) -}}
{{- fail (printf "%s %s overlaps %s, a path the chart mounts: use another directory" $.key $dir $own) -}}
{{- end -}}
{{- end -}}
{{- $dir -}}
{{- end -}}

{{/*
The host directory of the textfile collector, mounted at the same path in the pod: textfileDirectory (ours) when set,
else textfileDir (the Go chart's name); "" when off.
*/}}
{{- define "nvdaemon.textfileDirectory" -}}
{{- $ne := .Values.nodeExporter -}}
{{- $key := ternary "nodeExporter.textfileDirectory" "nodeExporter.textfileDir" (not (empty $ne.textfileDirectory)) -}}
{{- $dir := default $ne.textfileDir $ne.textfileDirectory -}}
{{- if $dir -}}{{- include "nvdaemon.ownPath" (dict "key" $key "dir" $dir) -}}{{- end -}}
{{- end -}}

{{/* The history store's mount path, checked like the textfile directory's (and against it). */}}
{{- define "nvdaemon.historyMountPath" -}}
{{- $dir := include "nvdaemon.ownPath" (dict "key" "history.mountPath" "dir" .Values.history.mountPath) -}}
{{- $textfile := "" -}}
{{- if .Values.nodeExporter.enabled -}}{{- $textfile = include "nvdaemon.textfileDirectory" . -}}{{- end -}}
{{- if and $textfile (or (eq $dir $textfile) (hasPrefix (printf "%s/" $textfile) $dir) (hasPrefix (printf "%s/" $dir) $textfile)) -}}
{{- fail (printf "history.mountPath %s overlaps the textfile directory %s: use another directory" $dir $textfile) -}}
{{- end -}}
{{- $dir -}}
{{- end -}}

{{/* runAsUser, runAsGroup and runAsNonRoot of a securityContext for the uid (and gid) . (0: root). */}}
{{- define "nvdaemon.runAs" -}}
runAsUser: {{ . }}
runAsGroup: {{ . }}
runAsNonRoot: {{ ne (int .) 0 }}
{{- end -}}

{{/* An IPv6 bind address needs brackets in HOST:PORT. */}}
{{- define "nvdaemon.bindHost" -}}
{{- if and (contains ":" .) (not (hasPrefix "[" .)) -}}[{{ . }}]{{- else -}}{{ . }}{{- end -}}
{{- end -}}

{{/*
A memory quantity (the Kubernetes syntax: 64Mi, 1G, 268435456) in MiB, as a number; "" when it is not one.
*/}}
{{- define "nvdaemon.memoryMiB" -}}
{{- $q := toString . -}}
{{- if or (kindIs "float64" .) (kindIs "int64" .) (kindIs "int" .) -}}{{- $q = printf "%.0f" (float64 .) -}}{{- end -}}{{/* 1e+08 */}}
{{- if regexMatch "^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$" $q -}}
{{- $number := regexReplaceAll "[^0-9.]+$" $q "" -}}
{{- $unit := regexReplaceAll "^[0-9.]+" $q "" -}}
{{- $factors := dict "" 1.0 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0 "P" 1000000000000000.0 "E" 1000000000000000000.0 -}}
{{- divf (mulf (float64 $number) (index $factors $unit)) 1048576.0 -}}
{{- end -}}
{{- end -}}
