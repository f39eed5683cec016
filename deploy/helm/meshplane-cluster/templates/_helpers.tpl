{{- define "mc.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "mc.labels" -}}
app.kubernetes.io/part-of: meshplane
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* (dict "ctx" $ "component" "agent") */}}
{{- define "mc.selector" -}}
app.kubernetes.io/name: {{ .component }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- end -}}

{{- define "mc.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "mc.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid | default 10001 }}
runAsGroup: {{ .uid | default 10001 }}
fsGroup: {{ .uid | default 10001 }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "mc.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* ORG/CLUSTER, from the install template's clusterFqn (organizations/ORG/clusters/CLUSTER). */}}
{{- define "mc.cluster" -}}
{{- $fqn := required "secrets.clusterServiceAccount.clusterFqn is required: install with the cluster's installTemplate.helm values" .Values.secrets.clusterServiceAccount.clusterFqn -}}
{{- $p := splitList "/" $fqn -}}
{{- if and (eq (len $p) 4) (eq (index $p 0) "organizations") (eq (index $p 2) "clusters") -}}
{{- printf "%s/%s" (index $p 1) (index $p 3) -}}
{{- else -}}
{{- fail (printf "secrets.clusterServiceAccount.clusterFqn must be organizations/ORG/clusters/CLUSTER, not %q" $fqn) -}}
{{- end -}}
{{- end -}}

{{/* grpcs://HOST:PORT of mgmt-api's gRPC port. */}}
{{- define "mc.controlPlane" -}}
{{- $gw := .Values.gateway | default dict -}}
{{- required "controlPlane.address is required (grpcs://HOST:PORT of mgmt-api's gRPC Service) when the install template has no gateway.ads" (.Values.controlPlane.address | default $gw.ads) -}}
{{- end -}}

{{- define "mc.caFile" -}}
{{- if or .Values.controlPlane.ca .Values.controlPlane.caConfigMap -}}/etc/meshplane/control-plane-ca/ca.crt{{- end -}}
{{- end -}}

{{/* The flags every subscriber (agent, extauthz, ratelimit) reaches mgmt-api with;
     --credentials is the component's own key (mc.credentialsVolume). */}}
{{- define "mc.subscriberArgs" -}}
- --control-plane
- {{ include "mc.controlPlane" . | quote }}
{{- with include "mc.caFile" . }}
- --control-plane-ca
- {{ . }}
{{- end }}
{{- if .Values.controlPlane.clientCertSecret }}
- --control-plane-cert
- /etc/meshplane/client-cert/tls.crt
- --control-plane-key
- /etc/meshplane/client-cert/tls.key
{{- end }}
- --cluster
- {{ include "mc.cluster" . | quote }}
- --credentials
- /etc/meshplane/credentials/credentials.json
{{- end -}}

{{/* dict "ctx" . "component" NAME: the component's own credentials and the shared CA,
     client certificate. */}}
{{- define "mc.subscriberMounts" -}}
{{- $ctx := .ctx -}}
- {name: {{ .component }}-credentials, mountPath: /etc/meshplane/credentials, readOnly: true}
{{- with $ctx -}}
{{- if include "mc.caFile" . }}
- {name: control-plane-ca, mountPath: /etc/meshplane/control-plane-ca, readOnly: true}
{{- end }}
{{- if .Values.controlPlane.clientCertSecret }}
- {name: client-cert, mountPath: /etc/meshplane/client-cert, readOnly: true}
{{- end }}
{{- end }}
{{- end -}}

{{/* The install template's entry holding COMPONENT's key (docs/api.md "Cluster credentials"). */}}
{{- define "mc.credentialsEntry" -}}
{{- ternary "clusterServiceAccount" (printf "%sServiceAccount" .) (eq . "agent") -}}
{{- end -}}

{{/* dict "ctx" . "component" NAME: the Secret volume of that component's key alone. */}}
{{- define "mc.credentialsVolume" -}}
- name: {{ .component }}-credentials
  secret:
    secretName: {{ include "mc.fullname" .ctx }}-{{ .component }}-credentials
    defaultMode: 0440
{{- end -}}

{{/* What every subscriber's pod mounts besides its key: the CA, the client certificate. */}}
{{- define "mc.subscriberVolumes" -}}
{{- if include "mc.caFile" . }}
- name: control-plane-ca
  configMap:
    name: {{ .Values.controlPlane.caConfigMap | default (printf "%s-control-plane-ca" (include "mc.fullname" .)) }}
    items: [{key: ca.crt, path: ca.crt}]
{{- end }}
{{- if .Values.controlPlane.clientCertSecret }}
- name: client-cert
  secret:
    secretName: {{ .Values.controlPlane.clientCertSecret }}
    defaultMode: 0440
{{- end }}
{{- end -}}

{{- define "mc.sidecar" -}}
{{- eq .Values.enforcement.placement "sidecar" -}}
{{- end -}}

{{/* Where the gateway reaches ratelimit and extauthz, and where they listen. */}}
{{- define "mc.ratelimitListen" -}}
{{- if ne (include "mc.sidecar" .) "true" -}}0.0.0.0:8081
{{- else if eq .Values.enforcement.sidecar.transport "uds" -}}unix:{{ .Values.enforcement.sidecar.socketDir }}/ratelimit.sock
{{- else -}}127.0.0.1:8081{{- end -}}
{{- end -}}
{{- define "mc.extauthzListen" -}}
{{- if ne (include "mc.sidecar" .) "true" -}}0.0.0.0:9191
{{- else if eq .Values.enforcement.sidecar.transport "uds" -}}unix:{{ .Values.enforcement.sidecar.socketDir }}/extauthz.sock
{{- else -}}127.0.0.1:9191{{- end -}}
{{- end -}}
{{- define "mc.ratelimitService" -}}
{{- if ne (include "mc.sidecar" .) "true" -}}grpc://{{ include "mc.fullname" . }}-ratelimit.{{ .Release.Namespace }}.svc:8081
{{- else if eq .Values.enforcement.sidecar.transport "uds" -}}unix://{{ .Values.enforcement.sidecar.socketDir }}/ratelimit.sock
{{- else -}}grpc://127.0.0.1:8081{{- end -}}
{{- end -}}

{{/* The Redis URL ratelimit starts with, or "" (in memory). */}}
{{- define "mc.redisUrlFile" -}}
{{- $be := (((index .Values "gateway-helm").config.envoyGateway.rateLimit.backend).redis) | default dict -}}
{{- if not .Values.redis.disabled -}}/etc/meshplane/redis-url/url
{{- else if $be.urlRef -}}/var/run/secrets/meshplane/{{ $be.urlRef.namespace | default .Release.Namespace }}/{{ $be.urlRef.name }}/url
{{- else if $be.url -}}/etc/meshplane/redis-url/url
{{- end -}}
{{- end -}}

{{/* The Secret of redis.tls.certificateRef: its name, "" when unset. A name, or
Envoy Gateway's object form {name, namespace, kind: Secret}; the namespace (when
given) must be the release's, since a pod mounts Secrets of its own namespace only. */}}
{{- define "mc.redisTlsSecret" -}}
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
