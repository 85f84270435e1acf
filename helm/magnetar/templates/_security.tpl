{{/*
Security of the Magnetar chart: which parts of TLS and authentication are on, the certificate of
each component (its Secret, its names), what each pod mounts, and the settings that point the
processes at the mounted files. Each switch is "true" or "" (so `if (include ...)` reads it).

Mounted, read-only, in the pods that need them:
  /etc/magnetar/tls/{tls.crt,tls.key,ca.crt}   the component's own certificate (CN = its role)
  /etc/magnetar/etcd-tls/{...}                 an external etcd's CA and client certificate
  /etc/magnetar/etcd-password/password         an external etcd user's password
  /etc/magnetar/token-key/secret.key           the token signing key (brokers)
  /etc/magnetar/superuser/{token,static-tokens} the superuser token, and its SHA-256 line
*/}}

{{- define "magnetar.tls.broker" -}}
{{- if and .Values.tls.enabled .Values.tls.broker.enabled -}}true{{- end -}}
{{- end -}}

{{- define "magnetar.tls.bookie" -}}
{{- if and .Values.tls.enabled .Values.tls.bookie.enabled -}}true{{- end -}}
{{- end -}}

{{- define "magnetar.tls.etcd" -}}
{{- if and .Values.tls.enabled .Values.tls.etcd.enabled -}}true{{- end -}}
{{- end -}}

{{- define "magnetar.tls.http" -}}
{{- if and .Values.tls.enabled .Values.tls.http.enabled -}}true{{- end -}}
{{- end -}}

{{/* The in-chart etcd, with TLS: it and the init Job carry certificates of the chart. */}}
{{- define "magnetar.tls.inChartEtcd" -}}
{{- if and .Values.etcd.enabled (include "magnetar.tls.etcd" .) -}}true{{- end -}}
{{- end -}}

{{/* The brokers' Pulsar-protocol ports that are open: the plaintext one with the plaintext gRPC
port, the TLS one with TLS; either closed by a null value. A dict: "pulsar" and "pulsarTls",
each a port or "". */}}
{{- define "magnetar.broker.pulsarPorts" -}}
{{- $plain := "" -}}
{{- $tls := "" -}}
{{- if and (include "magnetar.broker.plaintext" .) .Values.broker.ports.pulsar -}}{{- $plain = .Values.broker.ports.pulsar -}}{{- end -}}
{{- if and (include "magnetar.tls.broker" .) .Values.broker.ports.pulsarTls -}}{{- $tls = .Values.broker.ports.pulsarTls -}}{{- end -}}
{{- dict "pulsar" $plain "pulsarTls" $tls | toJson -}}
{{- end -}}

{{/* Whether the broker's plaintext port is open. */}}
{{- define "magnetar.broker.plaintext" -}}
{{- if or (not (include "magnetar.tls.broker" .)) .Values.tls.broker.plaintextPort -}}true{{- end -}}
{{- end -}}

{{- define "magnetar.auth.broker" -}}
{{- if .Values.auth.enabled -}}true{{- end -}}
{{- end -}}

{{- define "magnetar.auth.authorization" -}}
{{- if and .Values.auth.enabled .Values.auth.authorization -}}true{{- end -}}
{{- end -}}

{{/* Bookies check certificate roles: only with their TLS on (the certificate is the credential). */}}
{{- define "magnetar.auth.bookie" -}}
{{- if and .Values.auth.bookie.enabled (include "magnetar.tls.bookie" .) -}}true{{- end -}}
{{- end -}}

{{/* Roles that may use the bookies: the common names of the brokers' and autorecovery's
certificates, and the bookies' own when they run autorecovery, with the config's. */}}
{{- define "magnetar.bookie.clientRoles" -}}
{{- $roles := list "broker" -}}
{{- if .Values.autorecovery.enabled -}}{{- $roles = append $roles "autorecovery" -}}{{- end -}}
{{- if include "magnetar.bookie.runsAutorecovery" . -}}{{- $roles = append $roles "bookie" -}}{{- end -}}
{{- $config := default dict .Values.bookie.config -}}
{{- $roles = concat $roles (default list $config.bookie_client_roles) | uniq -}}
{{- toJson $roles -}}
{{- end -}}

{{- define "magnetar.bookie.runsAutorecovery" -}}
{{- $config := default dict .Values.bookie.config -}}
{{- if $config.autorecovery -}}true{{- end -}}
{{- end -}}

{{/* Whether a component carries a certificate of the chart; call with
(dict "ctx" $ "component" "broker"). */}}
{{- define "magnetar.tls.hasCert" -}}
{{- $ctx := .ctx -}}
{{- $uses := or (include "magnetar.tls.http" $ctx) (include "magnetar.tls.inChartEtcd" $ctx) -}}
{{- if eq .component "broker" -}}
{{- if or $uses (include "magnetar.tls.broker" $ctx) (include "magnetar.tls.bookie" $ctx) -}}true{{- end -}}
{{- else if eq .component "bookie" -}}
{{- if or $uses (include "magnetar.tls.bookie" $ctx) -}}true{{- end -}}
{{- else if eq .component "autorecovery" -}}
{{- if and $ctx.Values.autorecovery.enabled (or $uses (include "magnetar.tls.bookie" $ctx)) -}}true{{- end -}}
{{- else if or (eq .component "init") (eq .component "etcd") -}}
{{- include "magnetar.tls.inChartEtcd" $ctx -}}
{{- end -}}
{{- end -}}

{{/* The components that carry a certificate of the chart, as a JSON list. */}}
{{- define "magnetar.tls.components" -}}
{{- $components := list -}}
{{- range $component := list "broker" "bookie" "autorecovery" "init" "etcd" -}}
{{- if include "magnetar.tls.hasCert" (dict "ctx" $ "component" $component) -}}
{{- $components = append $components $component -}}
{{- end -}}
{{- end -}}
{{- toJson $components -}}
{{- end -}}

{{/* The Secret of a component's certificate (tls.crt, tls.key, ca.crt); call with
(dict "ctx" $ "component" "broker"). */}}
{{- define "magnetar.tls.secretName" -}}
{{- $values := .ctx.Values -}}
{{- if eq $values.tls.source "secrets" -}}
{{- $name := (index $values.tls .component).secretName -}}
{{- required (printf "tls.%s.secretName: name the Secret holding the %s certificate (tls.crt, tls.key and ca.crt), since tls.source is secrets" .component .component) $name -}}
{{- else -}}
{{- printf "%s-%s-tls" (include "magnetar.fullname" .ctx) .component -}}
{{- end -}}
{{- end -}}

{{/* The names a component's certificate holds, as JSON {"dnsNames": [...], "ipAddresses":
[...]}: its Service, the names its pods are reached by, and localhost (for commands run in the
pod, such as `kubectl exec ... magnetar topics list --service-url magnetar+ssl://localhost:6651`).
Call with (dict "ctx" $ "component" "broker"). */}}
{{- define "magnetar.tls.hosts" -}}
{{- $ctx := .ctx -}}
{{- $fullname := include "magnetar.fullname" $ctx -}}
{{- $ns := $ctx.Release.Namespace -}}
{{- $domain := $ctx.Values.clusterDomain -}}
{{- $dns := list -}}
{{- $ips := list -}}
{{- if ne .component "init" -}}
{{- $services := list (printf "%s-%s" $fullname .component) -}}
{{- if eq .component "etcd" -}}
{{- $services = list (include "magnetar.etcd.fullname" $ctx) (include "magnetar.etcd.headless" $ctx) -}}
{{- end -}}
{{- range $service := $services -}}
{{- $dns = concat $dns (list $service (printf "%s.%s" $service $ns) (printf "%s.%s.svc" $service $ns) (printf "%s.%s.svc.%s" $service $ns $domain)) -}}
{{- end -}}
{{- if eq .component "broker" -}}
{{- /* brokers advertise <pod IP with dashes>.<namespace>.pod.<domain> */ -}}
{{- $dns = append $dns (printf "*.%s.pod.%s" $ns $domain) -}}
{{- $dns = concat $dns $ctx.Values.tls.broker.extraDnsNames -}}
{{- else if eq .component "bookie" -}}
{{- /* bookies advertise <pod>.<headless Service>.<namespace>.svc.<domain> */ -}}
{{- $dns = append $dns (printf "*.%s-bookie.%s.svc.%s" $fullname $ns $domain) -}}
{{- else if eq .component "etcd" -}}
{{- $dns = append $dns (printf "*.%s.%s.svc.%s" (include "magnetar.etcd.headless" $ctx) $ns $domain) -}}
{{- end -}}
{{- $dns = append $dns "localhost" -}}
{{- $ips = list "127.0.0.1" "::1" -}}
{{- end -}}
{{- toJson (dict "dnsNames" (uniq $dns) "ipAddresses" $ips) -}}
{{- end -}}

{{/* The etcd settings of a Magnetar process (TLS files, user), as JSON; call with
(dict "ctx" $). Paths are where magnetar.security.volumes mounts them. */}}
{{- define "magnetar.etcd.clientSettings" -}}
{{- $ctx := .ctx -}}
{{- $settings := dict -}}
{{- if include "magnetar.tls.etcd" $ctx -}}
{{- $dir := ternary "/etc/magnetar/tls" "/etc/magnetar/etcd-tls" $ctx.Values.etcd.enabled -}}
{{- $settings = dict "etcd_trust_certs_file" (printf "%s/ca.crt" $dir) "etcd_cert_file" (printf "%s/tls.crt" $dir) "etcd_key_file" (printf "%s/tls.key" $dir) -}}
{{- end -}}
{{- if and (not $ctx.Values.etcd.enabled) $ctx.Values.etcd.external.user -}}
{{- $_ := set $settings "etcd_user" $ctx.Values.etcd.external.user -}}
{{- $_ := set $settings "etcd_password_file" "/etc/magnetar/etcd-password/password" -}}
{{- end -}}
{{- toJson $settings -}}
{{- end -}}

{{/* The superuser token's Secret. */}}
{{- define "magnetar.auth.superuserSecret" -}}
{{- default (printf "%s-superuser" (include "magnetar.fullname" .)) .Values.auth.superuserToken.secretName -}}
{{- end -}}

{{- define "magnetar.auth.tokenKeySecret" -}}
{{- default (printf "%s-token-key" (include "magnetar.fullname" .)) .Values.auth.tokenKey.secretName -}}
{{- end -}}

{{/* The volumes of the Secrets a pod mounts; call with (dict "ctx" $ "component" "broker").
The helm test pod ("test") gets only the CA and the superuser token. */}}
{{- define "magnetar.security.volumes" -}}
{{- $ctx := .ctx -}}
{{- $magnetar := has .component (list "broker" "bookie" "autorecovery" "init") -}}
{{- if include "magnetar.tls.hasCert" . }}
- name: tls
  secret:
    secretName: {{ include "magnetar.tls.secretName" . }}
    defaultMode: 0440
{{- end }}
{{- if and (eq .component "test") (include "magnetar.tls.broker" $ctx) }}
- name: tls
  secret:
    secretName: {{ include "magnetar.tls.secretName" (dict "ctx" $ctx "component" "broker") }}
    defaultMode: 0440
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- if and $magnetar (not $ctx.Values.etcd.enabled) (include "magnetar.tls.etcd" $ctx) }}
- name: etcd-tls
  secret:
    secretName: {{ required "etcd.external.tls.secretName: name the Secret holding your etcd's CA (ca.crt) and a client certificate it accepts (tls.crt, tls.key), or set tls.etcd.enabled=false for an etcd without TLS" $ctx.Values.etcd.external.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- if and $magnetar (not $ctx.Values.etcd.enabled) $ctx.Values.etcd.external.user }}
- name: etcd-password
  secret:
    secretName: {{ required "etcd.external.passwordSecretName: name the Secret holding the password (key password) of etcd.external.user" $ctx.Values.etcd.external.passwordSecretName }}
    defaultMode: 0440
    items:
      - key: password
        path: password
{{- end }}
{{- if and (eq .component "broker") (include "magnetar.auth.broker" $ctx) }}
- name: token-key
  secret:
    secretName: {{ include "magnetar.auth.tokenKeySecret" $ctx }}
    defaultMode: 0440
    items:
      - key: secret.key
        path: secret.key
{{- end }}
{{- if and (has .component (list "broker" "test")) (include "magnetar.auth.broker" $ctx) }}
- name: superuser
  secret:
    secretName: {{ include "magnetar.auth.superuserSecret" $ctx }}
    defaultMode: 0440
    items:
      - key: token
        path: token
      {{- if and (eq .component "broker") (not $ctx.Values.auth.superuserToken.secretName) }}
      - key: static-tokens
        path: static-tokens
      {{- end }}
{{- end }}
{{- end -}}

{{/* The mounts of those volumes: every one read-only. */}}
{{- define "magnetar.security.volumeMounts" -}}
{{- range $volume := include "magnetar.security.volumes" . | fromYamlArray }}
- name: {{ $volume.name }}
  mountPath: /etc/magnetar/{{ $volume.name }}
  readOnly: true
{{- end }}
{{- end -}}

{{/* The HTTP probe scheme. */}}
{{- define "magnetar.http.scheme" -}}
{{- ternary "HTTPS" "HTTP" (eq (include "magnetar.tls.http" .) "true") -}}
{{- end -}}

{{/* The service URL of clients in the cluster: the broker Service's TLS port while it is on. */}}
{{- define "magnetar.serviceUrl" -}}
{{- $host := printf "%s-broker.%s.svc.%s" (include "magnetar.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- if include "magnetar.tls.broker" . -}}
magnetar+ssl://{{ $host }}:{{ .Values.broker.ports.grpcTls }}
{{- else -}}
magnetar://{{ $host }}:{{ .Values.broker.ports.grpc }}
{{- end -}}
{{- end -}}

{{/* How Prometheus scrapes a component's HTTPS port: trusting the chart's CA, and checking the
name of the component's Service, which its certificate holds. Call with
(dict "ctx" $ "component" "broker"). */}}
{{- define "magnetar.monitorTls" -}}
{{- if include "magnetar.tls.http" .ctx -}}
scheme: https
tlsConfig:
  ca:
    secret:
      name: {{ include "magnetar.tls.secretName" . }}
      key: ca.crt
  serverName: {{ printf "%s-%s.%s.svc" (include "magnetar.fullname" .ctx) .component .ctx.Release.Namespace }}
{{- end -}}
{{- end -}}
