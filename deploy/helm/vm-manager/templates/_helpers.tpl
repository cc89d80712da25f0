{{/* Names and labels. */}}
{{- define "vm-manager.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vm-manager.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "vm-manager.selectorLabels" -}}
app.kubernetes.io/name: {{ include "vm-manager.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vm-manager.labels" -}}
{{ include "vm-manager.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "vm-manager.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "vm-manager.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "vm-manager.image" -}}
{{- printf "%s/%s:%s" .Values.image.registry .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "vm-manager.guestImage" -}}
{{- printf "%s:%s" .Values.guestImage.repository (.Values.guestImage.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "vm-manager.headlessName" -}}
{{- printf "%s-pods" (include "vm-manager.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
OAuth: every value of .Values.oauth that is empty or null falls back to global.identity, the
platform's settings. "vm-manager.identity" is that merged view as YAML, read back with fromYaml.
*/}}
{{- define "vm-manager.identity" -}}
{{- $g := dict -}}
{{- if and .Values.global (kindIs "map" .Values.global.identity) -}}{{- $g = .Values.global.identity -}}{{- end -}}
{{- $o := .Values.oauth | default dict -}}
{{- $od := $o.dex | default dict -}}
{{- $gd := $g.dex | default dict -}}
{{- $oo := $o.google | default dict -}}
{{- $go := $g.google | default dict -}}
{{- $odSecret := $od.clientSecret | default dict -}}
{{- $gdSecret := $gd.clientSecret | default dict -}}
{{- $odCA := $od.caSecret | default dict -}}
{{- $gdCA := $gd.caSecret | default dict -}}
{{- $ooSecret := $oo.clientSecret | default dict -}}
{{- $goSecret := $go.clientSecret | default dict -}}
enabled: {{ ternary $o.enabled ($g.enabled | default false) (kindIs "bool" $o.enabled) }}
baseUrl: {{ $o.baseUrl | default "" | quote }}
provider: {{ $o.provider | default $g.provider | default "dex" | quote }}
trustedAudiences: {{ $o.trustedAudiences | default $g.trustedAudiences | default list | toJson }}
allowPublicClientRegistration: {{ $o.allowPublicClientRegistration | default false }}
ssoAllowPrivateIps: {{ ternary $o.ssoAllowPrivateIps ($g.ssoAllowPrivateIps | default false) (kindIs "bool" $o.ssoAllowPrivateIps) }}
allowPrivateOAuthUrls: {{ ternary $o.allowPrivateOAuthUrls ($g.allowPrivateOAuthUrls | default false) (kindIs "bool" $o.allowPrivateOAuthUrls) }}
dex:
  issuerUrl: {{ $od.issuerUrl | default $gd.issuerUrl | default "" | quote }}
  clientId: {{ $od.clientId | default $gd.clientId | default "" | quote }}
  clientSecret:
    existingSecret: {{ $odSecret.existingSecret | default $gdSecret.existingSecret | default "" | quote }}
    key: {{ ternary $odSecret.key ($gdSecret.key | default "client-secret") (not (empty $odSecret.existingSecret)) | quote }}
  caSecret:
    name: {{ $odCA.name | default $gdCA.name | default "" | quote }}
    key: {{ ternary $odCA.key ($gdCA.key | default "ca.crt") (not (empty $odCA.name)) | quote }}
google:
  clientId: {{ $oo.clientId | default $go.clientId | default "" | quote }}
  clientSecret:
    existingSecret: {{ $ooSecret.existingSecret | default $goSecret.existingSecret | default "" | quote }}
    key: {{ ternary $ooSecret.key ($goSecret.key | default "client-secret") (not (empty $ooSecret.existingSecret)) | quote }}
{{- end -}}

{{/* The identity flags as environment variables (their fallbacks), checked for what each provider needs. */}}
{{- define "vm-manager.oauthEnv" -}}
{{- $id := include "vm-manager.identity" . | fromYaml -}}
{{- if $id.enabled }}
- name: VM_MANAGER_OAUTH_ENABLED
  value: "true"
- name: VM_MANAGER_OAUTH_BASE_URL
  value: {{ required "oauth.baseUrl is required with OAuth: this server's public origin, e.g. https://vm-manager.example.com" $id.baseUrl | quote }}
- name: VM_MANAGER_OAUTH_PROVIDER
  value: {{ $id.provider | quote }}
{{- with $id.trustedAudiences }}
- name: OAUTH_TRUSTED_AUDIENCES
  value: {{ join "," . | quote }}
{{- end }}
- name: SSO_ALLOW_PRIVATE_IPS
  value: {{ $id.ssoAllowPrivateIps | toString | quote }}
- name: VM_MANAGER_OAUTH_ALLOW_PUBLIC_REGISTRATION
  value: {{ $id.allowPublicClientRegistration | toString | quote }}
{{- if eq $id.provider "dex" }}
- name: DEX_ISSUER_URL
  value: {{ required "oauth.dex.issuerUrl (or global.identity.dex.issuerUrl) is required with the dex provider" $id.dex.issuerUrl | quote }}
- name: DEX_CLIENT_ID
  value: {{ required "oauth.dex.clientId (or global.identity.dex.clientId) is required with the dex provider" $id.dex.clientId | quote }}
- name: DEX_CLIENT_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ required "oauth.dex.clientSecret.existingSecret (or global.identity.dex.clientSecret.existingSecret) is required with the dex provider: a Secret with the client secret" $id.dex.clientSecret.existingSecret | quote }}
      key: {{ $id.dex.clientSecret.key | quote }}
{{- if $id.dex.caSecret.name }}
- name: DEX_CA_FILE
  value: {{ printf "/etc/vm-manager/dex-ca/%s" $id.dex.caSecret.key | quote }}
{{- end }}
- name: VM_MANAGER_OAUTH_ALLOW_PRIVATE_URLS
  value: {{ $id.allowPrivateOAuthUrls | toString | quote }}
{{- else if eq $id.provider "google" }}
- name: GOOGLE_CLIENT_ID
  value: {{ required "oauth.google.clientId (or global.identity.google.clientId) is required with the google provider" $id.google.clientId | quote }}
- name: GOOGLE_CLIENT_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ required "oauth.google.clientSecret.existingSecret (or global.identity.google.clientSecret.existingSecret) is required with the google provider: a Secret with the client secret" $id.google.clientSecret.existingSecret | quote }}
      key: {{ $id.google.clientSecret.key | quote }}
{{- else }}
{{- fail (printf "oauth.provider must be dex or google, not %q" $id.provider) }}
{{- end }}
{{- end }}
{{- end -}}
