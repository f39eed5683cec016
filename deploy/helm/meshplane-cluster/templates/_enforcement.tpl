{{/* The extauthz and ratelimit containers, shared by their own Deployments and,
     in the "sidecar services" placement, by the gateway's pod. */}}

{{- define "mc.grpcProbe" -}}
{{- if hasPrefix "unix:" .listen -}}
exec:
  # The gRPC health service over the socket (a kubelet grpc probe needs TCP).
  command:
    - python
    - -c
    - "import sys,grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; sys.exit(g.HealthStub(grpc.insecure_channel('{{ .listen }}')).Check(h.HealthCheckRequest(), timeout=3).status != 1)"
timeoutSeconds: 5
{{- else -}}
grpc: {port: {{ .port }}}
{{- end }}
periodSeconds: {{ .period }}
{{- end -}}

{{- define "mc.extauthzContainer" -}}
{{- $listen := include "mc.extauthzListen" . -}}
- name: extauthz
  image: {{ include "mc.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - extauthz
    - serve
    {{- if .Values.extauthz.config }}
    - --config
    - /etc/meshplane/extauthz/policy.yaml
    {{- else }}
    {{- include "mc.subscriberArgs" . | nindent 4 }}
    - --cache-dir
    - /var/cache/meshplane/extauthz
    {{- end }}
    - --listen
    - {{ $listen | quote }}
    - --metrics-listen
    - "0.0.0.0:9193"
    - --workers
    # A Unix socket is served by one worker (docs/runtime.md): scale by gateway pods.
    - {{ ternary 1 .Values.extauthz.workers (hasPrefix "unix:" $listen) | quote }}
    - --server
    - {{ .Values.extauthz.server | default "envoy" | quote }}
  env:
    - {name: PROMETHEUS_MULTIPROC_DIR, value: /var/run/meshplane/prometheus/extauthz}
  ports:
    {{- if not (hasPrefix "unix:" $listen) }}
    - {name: authz-grpc, containerPort: 9191}
    {{- end }}
    - {name: authz-metrics, containerPort: 9193}
  readinessProbe: {{- include "mc.grpcProbe" (dict "listen" $listen "port" 9191 "period" 5) | nindent 4 }}
  livenessProbe: {{- include "mc.grpcProbe" (dict "listen" $listen "port" 9191 "period" 10) | nindent 4 }}
  lifecycle:
    preStop: {sleep: {seconds: 5}}
  resources: {{- toYaml .Values.extauthz.resources | nindent 4 }}
  securityContext: {{- include "mc.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    - {name: tmp, mountPath: /tmp}
    - {name: cache, mountPath: /var/cache/meshplane}
    - {name: prometheus, mountPath: /var/run/meshplane/prometheus}
    {{- if eq .Values.enforcement.sidecar.transport "uds" }}
    - {name: sockets, mountPath: {{ .Values.enforcement.sidecar.socketDir }}}
    {{- end }}
    {{- if .Values.extauthz.config }}
    - {name: extauthz-config, mountPath: /etc/meshplane/extauthz, readOnly: true}
    {{- else }}
    {{- include "mc.subscriberMounts" (dict "ctx" . "component" "extauthz") | nindent 4 }}
    {{- end }}
{{- end -}}

{{- define "mc.ratelimitContainer" -}}
{{- $listen := include "mc.ratelimitListen" . -}}
{{- $urlFile := include "mc.redisUrlFile" . -}}
{{- $be := (((index .Values "gateway-helm").config.envoyGateway.rateLimit.backend).redis) | default dict -}}
- name: ratelimit
  image: {{ include "mc.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - ratelimit
    - serve
    {{- if .Values.ratelimit.config }}
    - --config
    - /etc/meshplane/ratelimit/rules
    {{- else }}
    {{- include "mc.subscriberArgs" . | nindent 4 }}
    - --cache-dir
    - /var/cache/meshplane/ratelimit
    {{- end }}
    - --settings
    - /etc/meshplane/ratelimit/settings/settings.yaml
    - --listen
    - {{ $listen | quote }}
    - --metrics-listen
    - "0.0.0.0:9102"
    - --workers
    # In memory (no store), counters are per process: one worker; a Unix
    # socket is served by one worker too (docs/runtime.md).
    - {{ ternary .Values.ratelimit.workers 1 (and (ne $urlFile "") (not (hasPrefix "unix:" $listen))) | quote }}
    - --server
    - {{ .Values.ratelimit.server | default "envoy" | quote }}
    {{- if $urlFile }}
    - --redis-url-file
    - {{ $urlFile }}
    {{- end }}
  env:
    - {name: PROMETHEUS_MULTIPROC_DIR, value: /var/run/meshplane/prometheus/ratelimit}
    # Where the cluster's rateLimit switches (urlRef, certificateRef) are read.
    - {name: MESHPLANE_SECRETS_DIR, value: /var/run/secrets/meshplane}
  ports:
    {{- if not (hasPrefix "unix:" $listen) }}
    - {name: rl-grpc, containerPort: 8081}
    {{- end }}
    - {name: rl-metrics, containerPort: 9102}
  readinessProbe: {{- include "mc.grpcProbe" (dict "listen" $listen "port" 8081 "period" 5) | nindent 4 }}
  livenessProbe: {{- include "mc.grpcProbe" (dict "listen" $listen "port" 8081 "period" 10) | nindent 4 }}
  lifecycle:
    preStop: {sleep: {seconds: 5}}
  resources: {{- toYaml .Values.ratelimit.resources | nindent 4 }}
  securityContext: {{- include "mc.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    - {name: tmp, mountPath: /tmp}
    - {name: cache, mountPath: /var/cache/meshplane}
    - {name: prometheus, mountPath: /var/run/meshplane/prometheus}
    - {name: ratelimit-settings, mountPath: /etc/meshplane/ratelimit/settings, readOnly: true}
    {{- if eq .Values.enforcement.sidecar.transport "uds" }}
    - {name: sockets, mountPath: {{ .Values.enforcement.sidecar.socketDir }}}
    {{- end }}
    {{- if .Values.ratelimit.config }}
    - {name: ratelimit-rules, mountPath: /etc/meshplane/ratelimit/rules, readOnly: true}
    {{- else }}
    {{- include "mc.subscriberMounts" (dict "ctx" . "component" "ratelimit") | nindent 4 }}
    {{- end }}
    {{- if or (not .Values.redis.disabled) $be.url }}
    - {name: redis-url, mountPath: /etc/meshplane/redis-url, readOnly: true}
    {{- end }}
    {{- if and .Values.redis.disabled $be.urlRef }}
    - {name: redis-url-ref, mountPath: /var/run/secrets/meshplane/{{ $be.urlRef.namespace | default .Release.Namespace }}/{{ $be.urlRef.name }}, readOnly: true}
    {{- end }}
    {{- $tlsSecret := include "mc.redisTlsSecret" . }}
    {{- if and (not .Values.redis.disabled) $tlsSecret }}
    - {name: redis-ca, mountPath: /var/run/secrets/meshplane/{{ .Release.Namespace }}/{{ $tlsSecret }}, readOnly: true}
    {{- end }}
{{- end -}}

{{/* The volumes of the containers above (the common ones once per pod). */}}
{{- define "mc.commonVolumes" -}}
- {name: tmp, emptyDir: {sizeLimit: 64Mi}}
- {name: cache, emptyDir: {sizeLimit: 128Mi}}
# prometheus_client's multiprocess files (the workers' metrics).
- {name: prometheus, emptyDir: {medium: Memory, sizeLimit: 64Mi}}
{{- end -}}

{{- define "mc.ratelimitVolumes" -}}
{{- $be := (((index .Values "gateway-helm").config.envoyGateway.rateLimit.backend).redis) | default dict -}}
{{- $fullname := include "mc.fullname" . -}}
- name: ratelimit-settings
  configMap: {name: {{ $fullname }}-ratelimit-settings}
{{- if .Values.ratelimit.config }}
- name: ratelimit-rules
  configMap: {name: {{ $fullname }}-ratelimit-rules}
{{- end }}
{{- if or (not .Values.redis.disabled) $be.url }}
- name: redis-url
  secret: {secretName: {{ $fullname }}-redis-url, defaultMode: 0440}
{{- end }}
{{- if and .Values.redis.disabled $be.urlRef }}
- name: redis-url-ref
  secret:
    secretName: {{ $be.urlRef.name }}
    defaultMode: 0440
    items: [{key: url, path: url}]
{{- end }}
{{- $tlsSecret := include "mc.redisTlsSecret" . }}
{{- if and (not .Values.redis.disabled) $tlsSecret }}
- name: redis-ca
  secret:
    secretName: {{ $tlsSecret }}
    defaultMode: 0440
    items: [{key: ca.crt, path: ca.crt}]
{{- end }}
{{- end -}}

{{- define "mc.extauthzVolumes" -}}
{{- if .Values.extauthz.config }}
- name: extauthz-config
  configMap: {name: {{ include "mc.fullname" . }}-extauthz-config}
{{- end }}
{{- end -}}
