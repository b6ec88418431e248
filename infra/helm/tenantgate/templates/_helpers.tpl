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
