{{/* Names: release-prefixed, 63 characters at most (DNS label). */}}
{{- define "nvdaemon.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nvdaemon.fullname" -}}
{{- if .Values.fullnameOverride -}}
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
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "nvdaemon.labels" -}}
helm.sh/chart: {{ include "nvdaemon.chart" . }}
{{ include "nvdaemon.selectorLabels" . }}
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

{{- define "nvdaemon.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
The DaemonSets to render, as YAML: a list of {name, component, state, tiers, hostMounts, nodeExporter}, one per
enabled tier, or one holding every enabled tier with singlePod. What the tiers need of the node is decided here for
the DaemonSet and the agent's config alike: hostMounts, the host's /proc and /sys (core, smart); nodeExporter, the
node_exporter drop-in, whose collectors run in the core tier only (the smart and gpu pods get neither its config nor
the host's / mounted).
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
{{- $sets = append $sets (dict "suffix" "" "component" "agent" "state" "all" "tiers" $enabled) -}}
{{- end -}}
{{- else -}}
{{- range $tier := $enabled -}}
{{- $sets = append $sets (dict "suffix" (printf "-%s" $tier) "component" $tier "state" $tier "tiers" (list $tier)) -}}
{{- end -}}
{{- end -}}
{{- $groups := list -}}
{{- range $g := $sets -}}
{{- $tiers := $g.tiers -}}
{{- $groups = append $groups (dict
  "name" (printf "%s%s" (include "nvdaemon.fullname" $) $g.suffix)
  "component" $g.component
  "state" $g.state
  "tiers" $tiers
  "hostMounts" (or (has "core" $tiers) (has "smart" $tiers))
  "nodeExporter" (and $.Values.nodeExporter.enabled (has "core" $tiers))) -}}
{{- end -}}
{{- dict "groups" $groups | toYaml -}}
{{- end -}}

{{/* Secret holding the inline webhook secrets (and nothing else). */}}
{{- define "nvdaemon.secretName" -}}
{{- printf "%s-webhooks" (include "nvdaemon.fullname" .) -}}
{{- end -}}

{{- define "nvdaemon.secretData" -}}
{{- $data := dict -}}
{{- range $i, $hook := .Values.webhooks -}}
{{- if and $hook.secret (not $hook.existingSecret) -}}
{{- $_ := set $data (printf "webhook-%d" $i) ($hook.secret | b64enc) -}}
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
{{- $_ := set $cfg "history" (deepCopy $v.history) -}}
{{- end -}}
{{- if .group.nodeExporter -}}
{{- $ne := omit $v.nodeExporter "collectors" "textfileDirectory" -}}{{/* only the keys set: the agent's defaults apply */}}
{{- range $key := list "diskstats" "filesystem" "netdev" "hwmon" -}}
{{- if not (index $ne $key) -}}{{- $ne = omit $ne $key -}}{{- end -}}
{{- end -}}
{{- if $v.nodeExporter.collectors -}}{{- $_ := set $ne "collectors" $v.nodeExporter.collectors -}}{{- end -}}
{{- if $v.nodeExporter.textfileDirectory -}}{{- $_ := set $ne "textfileDirectory" $v.nodeExporter.textfileDirectory -}}{{- end -}}
{{- $_ := set $cfg "nodeExporter" (deepCopy $ne) -}}
{{- $_ := set $cfg "rootfs" "/host/root" -}}{{/* the host's / (filesystem statfs, os-release, udev data) */}}
{{- end -}}
{{- if $v.dcgmCompat.enabled -}}{{- $_ := set $cfg "dcgmCompat" (dict "enabled" true) -}}{{- end -}}
{{- if $v.smartctlCompat.enabled -}}{{- $_ := set $cfg "smartctlCompat" (dict "enabled" true) -}}{{- end -}}
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

{{/*
The host directory of the textfile collector, mounted at the same path in the pod; it must not shadow the paths the
chart mounts itself.
*/}}
{{- define "nvdaemon.textfileDirectory" -}}
{{- $dir := .Values.nodeExporter.textfileDirectory -}}
{{- if $dir -}}
{{- range $own := list "/etc/nvdaemon" "/var/lib/nvdaemon" "/tmp" "/host" "/var/run/nvsentinel" "/var/run/secrets" -}}
{{- if or (eq $dir $own) (hasPrefix (printf "%s/" $own) $dir) (hasPrefix (printf "%s/" $dir) $own) -}}
{{- fail (printf "nodeExporter.textfileDirectory %s overlaps %s, a path the chart mounts: use another directory" $dir $own) -}}
{{- end -}}
{{- end -}}
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
