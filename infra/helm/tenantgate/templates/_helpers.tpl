{{/* Names and labels shared by every object. */}}
{{- define "tenantgate.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tenantgate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tenantgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ include "tenantgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "tenantgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tenantgate.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* repository@digest when a digest is pinned, repository:tag otherwise. */}}
{{- define "tenantgate.image" -}}
{{- if .digest -}}
{{- printf "%s@%s" .repository .digest -}}
{{- else -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}
{{- end -}}

{{/* Restricted pod security: non-root, no privilege escalation, no capabilities, read-only root. */}}
{{- define "tenantgate.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "tenantgate.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* GPU scheduling: the pool's label, its taint, and the GPU (or MIG slice) resource. */}}
{{- define "tenantgate.gpuPlacement" -}}
nodeSelector:
  {{- toYaml .Values.engine.nodeSelector | nindent 2 }}
tolerations:
  {{- toYaml .Values.engine.tolerations | nindent 2 }}
{{- end -}}

{{/* Where the model's files and caches go: the root filesystem is read-only. */}}
{{- define "tenantgate.writableEnv" -}}
- name: HOME
  value: /tmp
- name: XDG_CACHE_HOME
  value: /tmp/cache
- name: TENANTGATE_CACHE_DIR
  value: /tmp/cache/tenantgate
{{- end -}}

{{/* Where the gateway mounts its Key Vault objects (the namespace secret, the envelope signing key, upstream API keys). */}}
{{- define "tenantgate.gatewaySecretsDir" -}}
/mnt/secrets-store
{{- end -}}

{{/* Upstream API keys the gateway mounts: the named ones and each InferencePool's. */}}
{{- define "tenantgate.upstreamKeySecretNames" -}}
{{- $names := .Values.azure.upstreamKeySecretNames -}}
{{- range .Values.inferencePools -}}
{{- with .apiKeySecret -}}
{{- $names = append $names . -}}
{{- end -}}
{{- end -}}
{{- toJson (uniq $names) -}}
{{- end -}}

{{/* Whether the gateway reads a deployments file: always with remote engines or other upstreams. */}}
{{/*
The gateway's worker processes (TENANTGATE_WORKERS): 1 with the embedded engine (each worker
would load its own); else gateway.workers, or with 0 the whole cores of the CPU request
("2", 2, "2.5", "1500m"), at least 1.
*/}}
{{- define "tenantgate.gatewayWorkers" -}}
{{- if eq .Values.engine.mode "embedded" -}}
1
{{- else if .Values.gateway.workers -}}
{{- .Values.gateway.workers | int -}}
{{- else -}}
{{- $cpu := toString .Values.gateway.resources.requests.cpu -}}
{{- $millis := 0 -}}
{{- if hasSuffix "m" $cpu -}}
{{- $millis = trimSuffix "m" $cpu | atoi -}}
{{- else -}}
{{- $millis = mulf (float64 $cpu) 1000 | int -}}
{{- end -}}
{{- max 1 (div $millis 1000) | min 64 -}}
{{- end -}}
{{- end -}}

{{- define "tenantgate.hasDeploymentsFile" -}}
{{- if or (eq .Values.engine.mode "remote") .Values.inferencePools .Values.deployments -}}true{{- end -}}
{{- end -}}

{{/*
The deployments file (gateway/deployments/config.py): the served model's own deployment (the
StatefulSet's replicas, one stable URL per pod, or the embedded engine), an `openai` deployment
per InferencePool upstream, then `deployments` from the values, appended per model.
*/}}
{{- define "tenantgate.deploymentsFile" -}}
{{- $models := dict -}}
{{- $served := .Values.engine.servedModelName | default .Values.engine.model -}}
{{- if eq .Values.engine.mode "remote" -}}
{{- $engines := printf "%s-engine" (include "tenantgate.fullname" .) -}}
{{- $replicas := list -}}
{{- range $i := until (int .Values.engine.replicas) -}}
{{- $replicas = append $replicas (printf "http://%s-%d.%s.%s.svc.cluster.local:%d" $engines $i $engines $.Release.Namespace (int $.Values.engine.port)) -}}
{{- end -}}
{{- $entry := merge (dict "name" "engines" "kind" "tenantgate" "replicas" $replicas) (deepCopy .Values.engine.deployment) -}}
{{- $_ := set $models $served (list $entry) -}}
{{- else -}}
{{- $_ := set $models $served (list (dict "name" "embedded" "kind" "embedded")) -}}
{{- end -}}
{{- range .Values.inferencePools -}}
{{- $entry := dict "name" (.name | default (printf "inferencepool-%s" .poolName)) "kind" "openai" "dialect" (.dialect | default "vllm") "url" .url -}}
{{- with .upstreamModel -}}
{{- $_ := set $entry "upstream_model" . -}}
{{- end -}}
{{- with .apiKeySecret -}}
{{- $_ := set $entry "api_key_file" (printf "%s/%s" (include "tenantgate.gatewaySecretsDir" $) .) -}}
{{- end -}}
{{- $entry = merge $entry (deepCopy (.deployment | default dict)) -}}
{{- $_ := set $models .model (append (get $models .model | default list) $entry) -}}
{{- end -}}
{{- $mounted := include "tenantgate.upstreamKeySecretNames" . | fromJsonArray -}}
{{- range $model, $deployments := .Values.deployments -}}
{{- range $deployments -}}
{{- with .api_key_file -}}
{{- if not (and (eq (dir .) (include "tenantgate.gatewaySecretsDir" $)) (has (base .) $mounted)) -}}
{{- fail (printf "deployments.%s: api_key_file %s is not mounted; name the Key Vault secret in azure.upstreamKeySecretNames and use %s/<name>" $model . (include "tenantgate.gatewaySecretsDir" $)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $_ := set $models $model (concat (get $models $model | default list) $deployments) -}}
{{- end -}}
{{- dict "models" $models | toPrettyJson -}}
{{- end -}}

{{/* The TCP port a URL's server listens on: the explicit one, else the scheme's. */}}
{{- define "tenantgate.urlPort" -}}
{{- $url := urlParse . -}}
{{- $host := $url.host -}}
{{- if regexMatch ":[0-9]+$" $host -}}
{{- regexFind "[0-9]+$" $host -}}
{{- else if eq $url.scheme "https" -}}
443
{{- else -}}
80
{{- end -}}
{{- end -}}

{{/* The engines' service account: their own when they have an identity of their own, else the gateway's. */}}
{{- define "tenantgate.engineServiceAccount" -}}
{{- if .Values.azure.engineClientId -}}
{{- .Values.serviceAccount.engineName -}}
{{- else -}}
{{- .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An InferencePool upstream's HTTPRoute: dict "root" $ "pool" <the inferencePools entry>. */}}
{{- define "tenantgate.routeName" -}}
{{- printf "%s-%s" (include "tenantgate.fullname" .root) .pool.poolName | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The MCP servers file (gateway/mcp/config.py): `mcpServers` from the values, less each entry's
`egress` (the chart's, not the gateway's). An api_key_file must be a mounted Key Vault secret.
*/}}
{{- define "tenantgate.mcpServersFile" -}}
{{- $mounted := include "tenantgate.upstreamKeySecretNames" . | fromJsonArray -}}
{{- $servers := list -}}
{{- range .Values.mcpServers -}}
{{- with .api_key_file -}}
{{- if not (and (eq (dir .) (include "tenantgate.gatewaySecretsDir" $)) (has (base .) $mounted)) -}}
{{- fail (printf "mcpServers: api_key_file %s is not mounted; name the Key Vault secret in azure.upstreamKeySecretNames and use %s/<name>" . (include "tenantgate.gatewaySecretsDir" $)) -}}
{{- end -}}
{{- end -}}
{{- $servers = append $servers (omit . "egress") -}}
{{- end -}}
{{- dict "servers" $servers | toPrettyJson -}}
{{- end -}}
