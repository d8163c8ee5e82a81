{{/* Names, labels, and the rendered gateway and sidecar configurations. */}}

{{- define "spinlink.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "spinlink.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "gateway"). */}}
{{- define "spinlink.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spinlink.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "spinlink.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" }}
{{ include "spinlink.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: spinlink
{{- end -}}

{{- define "spinlink.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "spinlink.gateway.tlsSecretName" -}}
{{- default (printf "%s-gateway-tls" (include "spinlink.fullname" .)) .Values.gateway.tlsSecretName -}}
{{- end -}}

{{- define "spinlink.gateway.internalTlsSecretName" -}}
{{- default (printf "%s-gateway-internal-tls" (include "spinlink.fullname" .)) .Values.gateway.internalTlsSecretName -}}
{{- end -}}

{{/*
The identity (URI SAN) of the gateway's internal certificate, the one it
presents to the sidecars: what the sidecars' tunnel.tls.gatewayIdentities
names.
*/}}
{{- define "spinlink.gateway.identity" -}}
{{- printf "spiffe://spinlink/gateway/%s" (include "spinlink.fullname" .) -}}
{{- end -}}

{{/*
"true" when the sidecars serve /metrics on the pod network: asked for, or
needed by the PodMonitor.
*/}}
{{- define "spinlink.sidecar.metrics" -}}
{{- or .Values.sidecar.metrics.enabled .Values.monitoring.podMonitor.enabled -}}
{{- end -}}

{{- define "spinlink.sidecar.tlsSecretName" -}}
{{- default (printf "%s-sidecar-tls" (include "spinlink.fullname" .)) .Values.sidecar.tlsSecretName -}}
{{- end -}}

{{- define "spinlink.sidecar.configSecretName" -}}
{{- default (printf "%s-sidecar-config" (include "spinlink.fullname" .)) .Values.sidecar.existingConfigSecret -}}
{{- end -}}

{{/*
The identity (URI SAN) of the sidecars' certificate, which they present to
each other on the peer port: what peer.tls.peerIdentities names.
*/}}
{{- define "spinlink.sidecar.identity" -}}
{{- printf "spiffe://spinlink/sidecar/%s" (include "spinlink.fullname" .) -}}
{{- end -}}

{{/* The in-cluster name of the sidecar tunnel Service. */}}
{{- define "spinlink.sidecar.host" -}}
{{- printf "%s-sidecar.%s.svc" (include "spinlink.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "spinlink.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
The gateway configuration file (gateway/src/config.rs). Everything under
.Values.gateway.config is merged over it, so new keys need no template change.
*/}}
{{- define "spinlink.gateway.config" -}}
{{- $g := .Values.gateway -}}
{{- $upstreams := list -}}
{{- range $g.upstreams -}}
{{- $upstreams = append $upstreams (dict "url" .) -}}
{{- end -}}
{{- if not $upstreams -}}
{{- $upstream := dict "url" (printf "https://%s:%d" (include "spinlink.sidecar.host" .) (int .Values.sidecar.tunnelPort)) -}}
{{- if eq $g.discovery "endpointSlices" -}}
{{- /* Every ready sidecar pod, dialled at its address, checked by the Service's name. */ -}}
{{- $_ := set $upstream "discovery" (dict "endpointSlices" (dict "service" (printf "%s-sidecar" (include "spinlink.fullname" .)) "namespace" .Release.Namespace "portName" "tunnel")) -}}
{{- else if ne $g.discovery "static" -}}
{{- fail "gateway.discovery must be endpointSlices or static" -}}
{{- end -}}
{{- $upstreams = list $upstream -}}
{{- end -}}
{{- $tls := dict "certFile" "/etc/spinlink/tls/tls.crt" "keyFile" "/etc/spinlink/tls/tls.key" "clientCaFile" "/etc/spinlink/tls/ca.crt" -}}
{{- /* Towards the sidecars: the internal certificate and CA, never the agents'. */ -}}
{{- $upstreamTls := dict "caFile" "/etc/spinlink/internal-tls/ca.crt" "certFile" "/etc/spinlink/internal-tls/tls.crt" "keyFile" "/etc/spinlink/internal-tls/tls.key" -}}
{{- if not $g.upstreams -}}
{{- $_ := set $upstreamTls "serverName" (include "spinlink.sidecar.host" .) -}}
{{- end -}}
{{- $config := dict "gatewayId" (default (printf "%s-gateway" (include "spinlink.fullname" .)) $g.gatewayId) "listen" (printf "0.0.0.0:%d" (int $g.port)) "tls" $tls "policy" $g.policy "upstreams" $upstreams "upstreamTls" $upstreamTls -}}
{{- if $g.admin.enabled -}}
{{- $_ := set $config "admin" (dict "listen" (printf "0.0.0.0:%d" (int $g.admin.port))) -}}
{{- end -}}
{{- $listener := dict "maxConnectionAgeSeconds" (int $g.maxConnectionAgeSeconds) -}}
{{- if $g.proxyProtocol.enabled -}}
{{- $_ := set $listener "proxyProtocol" true -}}
{{- $_ := set $listener "proxyProtocolRequired" $g.proxyProtocol.required -}}
{{- $_ := set $listener "trustedProxies" $g.proxyProtocol.trustedProxies -}}
{{- end -}}
{{- $_ := set $config "listener" $listener -}}
{{- $config = mustMergeOverwrite $config (deepCopy $g.config) -}}
{{- toYaml $config -}}
{{- end -}}

{{/*
The sidecar's database URL. PostgreSQL's password is never in it: the
sidecar container gets PGPASSWORD from passwordSecret.
*/}}
{{- define "spinlink.sidecar.storeUrl" -}}
{{- $pg := .Values.sidecar.store.postgresql -}}
{{- if $pg.enabled -}}
{{- printf "postgres://%s@%s:%d/%s?sslmode=%s" $pg.user (required "sidecar.store.postgresql.host is required with postgresql.enabled" $pg.host) (int $pg.port) $pg.database $pg.sslMode -}}
{{- with $pg.schema -}}
{{- if not (regexMatch "^[a-z_][a-z0-9_]*$" .) -}}
{{- fail (printf "sidecar.store.postgresql.schema %q: lower-case letters, digits and _ only" .) -}}
{{- end -}}
{{- printf "&options=-c%%20search_path%%3D%s" . -}}
{{- end -}}
{{- else -}}
{{- .Values.sidecar.store.url -}}
{{- end -}}
{{- end -}}

{{/*
The sidecar configuration file (sidecar/src/config.rs). The facade listens on
loopback: only Clouddriver, in the same pod, talks to it. The tunnel serves
only the gateway's internal identity (or sidecar.gatewayIdentities).
*/}}
{{- define "spinlink.sidecar.config" -}}
{{- $s := .Values.sidecar -}}
{{- $gateways := $s.gatewayIdentities | default (list (include "spinlink.gateway.identity" .)) -}}
{{- $tls := dict "certFile" "/etc/spinlink/tls/tls.crt" "keyFile" "/etc/spinlink/tls/tls.key" "clientCaFile" "/etc/spinlink/tls/ca.crt" "gatewayIdentities" $gateways -}}
{{- $peers := $s.peerIdentities | default (list (include "spinlink.sidecar.identity" .)) -}}
{{- /* The same certificate both ways; advertiseUrl comes per pod (--peer-advertise-url). */ -}}
{{- $peerTls := dict "certFile" "/etc/spinlink/tls/tls.crt" "keyFile" "/etc/spinlink/tls/tls.key" "caFile" "/etc/spinlink/tls/ca.crt" "peerIdentities" $peers -}}
{{- $peer := dict "listen" (printf "0.0.0.0:%d" (int $s.peerPort)) "tls" $peerTls -}}
{{- $config := dict "tunnel" (dict "listen" (printf "0.0.0.0:%d" (int $s.tunnelPort)) "tls" $tls) "facade" (dict "listen" (printf "127.0.0.1:%d" (int $s.facadePort))) "peer" $peer "store" (dict "url" (include "spinlink.sidecar.storeUrl" .)) -}}
{{- if eq (include "spinlink.sidecar.metrics" .) "true" -}}
{{- $_ := set $config "metrics" (dict "listen" (printf "0.0.0.0:%d" (int $s.metrics.port))) -}}
{{- end -}}
{{- $r := $s.clouddriver.registration -}}
{{- if $r.enabled -}}
{{- $account := dict "namespaces" $r.namespaces "permissions" $r.permissions "onlySpinnakerManaged" $r.onlySpinnakerManaged -}}
{{- if $r.environment -}}
{{- $_ := set $account "environment" $r.environment -}}
{{- end -}}
{{/* Every Clouddriver pod reaches its own sidecar's facade on loopback. */}}
{{- $cd := dict "baseUrl" $r.baseUrl "facadeUrl" (printf "http://127.0.0.1:%d" (int $s.facadePort)) "account" $account "liveCheckMillis" (int $r.liveCheckMillis) "recheckSeconds" (int $r.recheckSeconds) -}}
{{- if $r.user -}}
{{- $_ := set $cd "user" $r.user -}}
{{- end -}}
{{- $_ := set $config "clouddriver" $cd -}}
{{- end -}}
{{- $config = mustMergeOverwrite $config (deepCopy $s.config) -}}
{{- toYaml $config -}}
{{- end -}}

{{/*
Clouddriver's settings that registration through its account management
API needs (clouddriver-local.yml): stored accounts, Kubernetes ones among
them, in SQL, loaded by the credentials poller.
*/}}
{{- define "spinlink.clouddriver.profile" -}}
{{- $p := .Values.sidecar.clouddriver.profile -}}
account:
  storage:
    # The account management API (CredentialsController) exists.
    enabled: true
    kubernetes:
      # Stored Kubernetes accounts are loaded at all.
      enabled: true
sql:
  # Account storage is SQL only; also configure sql.connectionPools and
  # sql.migration for your database.
  enabled: true
credentials:
  poller:
    # Without the poller, stored accounts load only when Clouddriver starts.
    enabled: true
    types:
      kubernetes:
        reloadFrequencyMs: {{ int $p.reloadFrequencyMs }}
{{- end -}}

{{/*
The sidecar container and its volumes, as a strategic-merge patch of the
Clouddriver Deployment: (dict "ctx" $ "name" DEPLOYMENT). Kept in step with
deploy/kustomize/spinnaker-service/clouddriver-sidecar-patch.yaml.
*/}}
{{- define "spinlink.sidecar.patch" -}}
{{- $ := .ctx -}}
{{- $s := $.Values.sidecar -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .name }}
spec:
  template:
    metadata:
      labels:
        spinlink.dev/sidecar: "true"
    spec:
      containers:
        - name: spinlink-sidecar
          image: {{ include "spinlink.image" $ }}
          imagePullPolicy: {{ $.Values.image.pullPolicy }}
          # Each pod advertises its own address to the other sidecars, and
          # names itself after the pod (SPINLINK_INSTANCE_ID); Kubernetes
          # expands $(POD_IP) from the env below.
          args: [sidecar, --config, /etc/spinlink/sidecar/sidecar.yaml, --peer-advertise-url, "https://$(POD_IP):{{ $s.peerPort }}"]
          env:
            - name: POD_IP
              valueFrom:
                fieldRef:
                  fieldPath: status.podIP
            - name: SPINLINK_INSTANCE_ID
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: SPINLINK_LOG
              value: {{ $.Values.logLevel | quote }}
            {{- with $s.store.postgresql }}
            {{- if .enabled }}
            - name: PGPASSWORD
              valueFrom:
                secretKeyRef:
                  name: {{ required "sidecar.store.postgresql.passwordSecret.name is required with postgresql.enabled" .passwordSecret.name }}
                  key: {{ .passwordSecret.key }}
            {{- end }}
            {{- end }}
          ports:
            - name: spinlink-tunnel
              containerPort: {{ $s.tunnelPort }}
              protocol: TCP
            - name: spinlink-peer
              containerPort: {{ $s.peerPort }}
              protocol: TCP
            {{- if eq (include "spinlink.sidecar.metrics" $) "true" }}
            - name: spinlink-metrics
              containerPort: {{ $s.metrics.port }}
              protocol: TCP
            {{- end }}
          readinessProbe:
            tcpSocket:
              port: spinlink-tunnel
            periodSeconds: 10
          livenessProbe:
            tcpSocket:
              port: spinlink-tunnel
            periodSeconds: 20
            failureThreshold: 6
          securityContext:
            {{- include "spinlink.securityContext" $ | nindent 12 }}
          {{- with $s.resources }}
          resources:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          volumeMounts:
            - name: spinlink-sidecar-config
              mountPath: /etc/spinlink/sidecar
              readOnly: true
            - name: spinlink-sidecar-tls
              mountPath: /etc/spinlink/tls
              readOnly: true
            - name: spinlink-sidecar-data
              mountPath: /var/lib/spinlink
      volumes:
        - name: spinlink-sidecar-config
          secret:
            secretName: {{ include "spinlink.sidecar.configSecretName" $ }}
        - name: spinlink-sidecar-tls
          secret:
            secretName: {{ include "spinlink.sidecar.tlsSecretName" $ }}
            defaultMode: 288 # 0440
        - name: spinlink-sidecar-data
          emptyDir: {}
{{- end -}}
