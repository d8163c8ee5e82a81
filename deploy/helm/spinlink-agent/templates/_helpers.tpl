{{/* Names, labels and the rendered agent configuration. */}}

{{- define "spinlink-agent.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "spinlink-agent.fullname" -}}
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

{{- define "spinlink-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spinlink-agent.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "spinlink-agent.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "spinlink-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: spinlink
{{- end -}}

{{- define "spinlink-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "spinlink-agent.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "spinlink-agent.agentId" -}}
{{- default .Release.Name .Values.agentId -}}
{{- end -}}

{{- define "spinlink-agent.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "spinlink-agent.fullname" .)) .Values.tls.secretName -}}
{{- end -}}

{{- define "spinlink-agent.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The distinct kubeconfig Secrets of infrastructure mode, in order. */}}
{{- define "spinlink-agent.kubeconfigSecrets" -}}
{{- $secrets := list -}}
{{- range .Values.accounts -}}
{{- $secrets = append $secrets (required (printf "accounts[%s].kubeconfigSecret is required in infrastructure mode" (toString .name)) .kubeconfigSecret) -}}
{{- end -}}
{{- toJson (uniq $secrets) -}}
{{- end -}}

{{/*
The agent configuration file (agent/src/config.rs). Chart-only keys
(kubeconfigSecret, kubeconfigKey) are dropped; every other account key and
everything under .Values.config passes through, so keys the agent gains need
no template change.
*/}}
{{- define "spinlink-agent.config" -}}
{{- $accounts := list -}}
{{- if eq .Values.mode "agent" -}}
{{- $account := deepCopy .Values.account -}}
{{- $_ := required "account.name is required in agent mode" $account.name -}}
{{- $_ := set $account "serviceAccount" true -}}
{{- /* Watch only where the Roles grant anything. */ -}}
{{- if and .Values.rbac.namespaces (not $account.namespaces) -}}
{{- $_ := set $account "namespaces" .Values.rbac.namespaces -}}
{{- end -}}
{{- /* Refuse relayed writes in the agent too, not only at the API server. */ -}}
{{- if and .Values.rbac.create (not .Values.rbac.deploy) (not $account.relay) -}}
{{- $_ := set $account "relay" (dict "verbs" (list "get" "list" "watch")) -}}
{{- end -}}
{{- $accounts = append $accounts $account -}}
{{- else if eq .Values.mode "infrastructure" -}}
{{- if not .Values.accounts -}}
{{- fail "accounts must list at least one cluster in infrastructure mode" -}}
{{- end -}}
{{- range .Values.accounts -}}
{{- $account := omit . "kubeconfigSecret" "kubeconfigKey" -}}
{{- $secret := required "accounts[].kubeconfigSecret is required in infrastructure mode" .kubeconfigSecret -}}
{{- $_ := set $account "kubeconfigFile" (printf "/etc/spinlink/kubeconfigs/%s/%s" $secret (default "kubeconfig" .kubeconfigKey)) -}}
{{- $accounts = append $accounts $account -}}
{{- end -}}
{{- else -}}
{{- fail (printf "mode must be agent or infrastructure, not %q" (toString .Values.mode)) -}}
{{- end -}}
{{- $gateway := dict "url" (required "gateway.url is required (https://HOST:PORT of the gateway)" .Values.gateway.url) -}}
{{- $_ := set $gateway "certFile" "/etc/spinlink/tls/tls.crt" -}}
{{- $_ := set $gateway "keyFile" "/etc/spinlink/tls/tls.key" -}}
{{- if .Values.tls.gatewayCa.secretName -}}
{{- $_ := set $gateway "caFile" (printf "/etc/spinlink/gateway-ca/%s" .Values.tls.gatewayCa.key) -}}
{{- else -}}
{{- $_ := set $gateway "caFile" "/etc/spinlink/tls/ca.crt" -}}
{{- end -}}
{{- with .Values.gateway.serverName -}}
{{- $_ := set $gateway "serverName" . -}}
{{- end -}}
{{- $config := dict "agentId" (include "spinlink-agent.agentId" .) "gateway" $gateway "kubernetes" (dict "accounts" $accounts) -}}
{{- if .Values.admin.enabled -}}
{{- $_ := set $config "admin" (dict "listen" (printf "0.0.0.0:%d" (int .Values.admin.port))) -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) -}}
{{- fail "replicaCount > 1 needs leaderElection.enabled: true (otherwise every replica caches every account)" -}}
{{- end -}}
{{- if .Values.leaderElection.enabled -}}
{{- $_ := set $config "leaderElection" (dict "enabled" true "leaseDurationSeconds" (int .Values.leaderElection.leaseDurationSeconds) "namespace" .Release.Namespace) -}}
{{- end -}}
{{- $config = mustMergeOverwrite $config (deepCopy .Values.config) -}}
{{- toYaml $config -}}
{{- end -}}

{{/* Verbs on every resource: docs/deploy/rbac.md. */}}
{{- define "spinlink-agent.verbs" -}}
{{- if .Values.rbac.deploy -}}
[get, list, watch, create, update, patch, delete]
{{- else -}}
[get, list, watch]
{{- end -}}
{{- end -}}
