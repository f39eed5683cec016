{{/* Names and labels shared by every object of the release. */}}
{{- define "meshplane.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "meshplane.labels" -}}
app.kubernetes.io/part-of: meshplane
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* selector labels of one component: (dict "ctx" $ "component" "mgmt-api") */}}
{{- define "meshplane.selector" -}}
app.kubernetes.io/name: {{ .component }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- end -}}

{{- define "meshplane.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The pod-level hardening every workload gets (restricted Pod Security Standard). */}}
{{- define "meshplane.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid | default 10001 }}
runAsGroup: {{ .uid | default 10001 }}
fsGroup: {{ .uid | default 10001 }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "meshplane.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "meshplane.tlsSecret" -}}
{{- if eq .Values.tls.source "certManager" -}}
{{- printf "%s-tls" (include "meshplane.fullname" .) -}}
{{- else -}}
{{- required "tls.secretName is required when tls.source is secret" .Values.tls.secretName -}}
{{- end -}}
{{- end -}}

{{- define "meshplane.restHost" -}}
{{- printf "%s-mgmt-api.%s.svc" (include "meshplane.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- define "meshplane.grpcHost" -}}
{{- printf "%s-mgmt-api-grpc.%s.svc" (include "meshplane.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* The spec 2.9 backend block (gateway-helm.config.envoyGateway.rateLimit.backend). */}}
{{- define "meshplane.rateLimitBackend" -}}
{{- $gh := index .Values "gateway-helm" | default dict -}}
{{- $cfg := $gh.config | default dict -}}
{{- $eg := $cfg.envoyGateway | default dict -}}
{{- $rl := $eg.rateLimit | default dict -}}
{{- toJson ($rl.backend | default dict) -}}
{{- end -}}

{{/* The Secret of redis.tls.certificateRef: its name, "" when unset. A name, or
Envoy Gateway's object form {name, namespace, kind: Secret}; the namespace (when
given) must be the release's, since a pod mounts Secrets of its own namespace only. */}}
{{- define "meshplane.redisTlsSecret" -}}
{{- $ref := .Values.redis.tls.certificateRef -}}
{{- if kindIs "map" $ref -}}
{{- if and $ref.namespace (ne $ref.namespace .Release.Namespace) -}}
{{- fail (printf "redis.tls.certificateRef.namespace must be this release's namespace %q (a pod mounts Secrets of its own namespace only), not %q" .Release.Namespace $ref.namespace) -}}
{{- end -}}
{{- $ref.name -}}
{{- else -}}
{{- $ref | default "" -}}
{{- end -}}
{{- end -}}
