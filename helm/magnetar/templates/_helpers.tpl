{{/*
Names, labels and shared pieces of the Magnetar chart.
*/}}

{{- define "magnetar.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object's name: <release>-magnetar, or the release name alone when it
already says magnetar. Short enough for the longest suffix (-autorecovery) to fit 63. */}}
{{- define "magnetar.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "magnetar.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "magnetar.clusterName" -}}
{{- default .Release.Name .Values.clusterName -}}
{{- end -}}

{{/* Labels of every object; call with (dict "ctx" $ "component" "broker"). */}}
{{- define "magnetar.labels" -}}
helm.sh/chart: {{ include "magnetar.chart" .ctx }}
{{ include "magnetar.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: magnetar
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The labels that select a component's pods (never change them: selectors are immutable). */}}
{{- define "magnetar.selectorLabels" -}}
app.kubernetes.io/name: {{ include "magnetar.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "magnetar.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "magnetar.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "magnetar.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "magnetar.etcd.fullname" -}}
{{- printf "%s-etcd" (include "magnetar.fullname" .) -}}
{{- end -}}

{{- define "magnetar.etcd.headless" -}}
{{- printf "%s-etcd-headless" (include "magnetar.fullname" .) -}}
{{- end -}}

{{/* host:port of each etcd member: the in-chart StatefulSet's stable pod names, or the external
endpoints. */}}
{{- define "magnetar.etcd.endpoints" -}}
{{- if .Values.etcd.enabled -}}
{{- $members := list -}}
{{- $fullname := include "magnetar.etcd.fullname" . -}}
{{- $headless := include "magnetar.etcd.headless" . -}}
{{- range $i := until (int .Values.etcd.replicaCount) -}}
{{- $members = append $members (printf "%s-%d.%s.%s.svc.%s:%d" $fullname $i $headless $.Release.Namespace $.Values.clusterDomain (int $.Values.etcd.ports.client)) -}}
{{- end -}}
{{- join "," $members -}}
{{- else -}}
{{- if not .Values.etcd.external.endpoints -}}
{{- fail "etcd.external.endpoints: list your etcd members (host:port) when etcd.enabled is false" -}}
{{- end -}}
{{- join "," .Values.etcd.external.endpoints -}}
{{- end -}}
{{- end -}}

{{- define "magnetar.metadataUrl" -}}
etcd://{{ include "magnetar.etcd.endpoints" . }}
{{- end -}}

{{/* A value in TOML. Helm reads every YAML number as a float, so a whole number is written as an
integer (Magnetar's integer settings refuse 3.0; its float settings take 3). */}}
{{- define "magnetar.tomlValue" -}}
{{- if kindIs "bool" . -}}
{{- . -}}
{{- else if or (kindIs "float64" .) (kindIs "int" .) (kindIs "int64" .) -}}
{{- if eq (float64 .) (floor .) -}}{{- int64 . -}}{{- else -}}{{- . -}}{{- end -}}
{{- else if kindIs "string" . -}}
{{- toJson . -}}
{{- else if kindIs "slice" . -}}
[{{- range $i, $item := . -}}{{- if $i -}}, {{ end -}}{{- include "magnetar.tomlValue" $item -}}{{- end -}}]
{{- else -}}
{{- fail (printf "cannot write %v (%s) as a TOML value" . (kindOf .)) -}}
{{- end -}}
{{- end -}}

{{/* A map as TOML: its scalars, then each nested map as a [table]. Keys whose value is null are
left out (the setting keeps its default). Call with (dict "values" MAP "prefix" ""). */}}
{{- define "magnetar.toml" -}}
{{- $prefix := .prefix -}}
{{- $tables := dict -}}
{{- range $key, $value := .values -}}
{{- if kindIs "map" $value -}}
{{- $_ := set $tables $key $value -}}
{{- else if not (kindIs "invalid" $value) }}
{{ $key }} = {{ include "magnetar.tomlValue" $value }}
{{- end -}}
{{- end -}}
{{- range $key, $value := $tables }}

[{{ if $prefix }}{{ $prefix }}.{{ end }}{{ $key }}]
{{- include "magnetar.toml" (dict "values" $value "prefix" (ternary (printf "%s.%s" $prefix $key) $key (ne $prefix ""))) -}}
{{- end -}}
{{- end -}}

{{/* The pod-level security context of every pod. */}}
{{- define "magnetar.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext -}}
{{- end -}}

{{/* The container-level security context: the user from the pod's, so each container states
that it runs as non-root on its own. */}}
{{- define "magnetar.containerSecurityContext" -}}
{{- $context := merge (dict "runAsUser" .Values.podSecurityContext.runAsUser "runAsGroup" .Values.podSecurityContext.runAsGroup) .Values.containerSecurityContext -}}
{{- toYaml $context -}}
{{- end -}}

{{/* Anti-affinity of a component's pods across nodes; call with
(dict "ctx" $ "component" "bookie" "mode" "soft"). */}}
{{- define "magnetar.antiAffinity" -}}
{{- $selector := include "magnetar.selectorLabels" . | fromYaml -}}
{{- if eq .mode "hard" -}}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- toYaml $selector | nindent 10 }}
{{- else if eq .mode "soft" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- toYaml $selector | nindent 12 }}
{{- end -}}
{{- end -}}

{{/* Environment of every Magnetar container. */}}
{{- define "magnetar.commonEnv" -}}
- name: MAGNETAR_LOG_FORMAT
  value: {{ .Values.logging.format | quote }}
- name: MAGNETAR_LOG_LEVEL
  value: {{ .Values.logging.level | quote }}
- name: GRPC_VERBOSITY
  value: "ERROR"
- name: PYTHONUNBUFFERED
  value: "1"
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* prometheus.io annotations for a pod serving /metrics on `port`. */}}
{{- define "magnetar.scrapeAnnotations" -}}
{{- if .ctx.Values.monitoring.annotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
prometheus.io/scheme: {{ include "magnetar.http.scheme" .ctx | lower }}
{{- end }}
{{- end -}}

{{/* E of new ledgers as the brokers will use it (managed_ledger.ensemble_size, else
ledger.ensemble_size, else 3), to check there are enough bookies. */}}
{{- define "magnetar.ensembleSize" -}}
{{- $config := default dict .Values.broker.config -}}
{{- $e := 3 -}}
{{- range $section := list "ledger" "managed_ledger" -}}
{{- $values := default dict (get $config $section) -}}
{{- if and (hasKey $values "ensemble_size") (not (kindIs "invalid" (index $values "ensemble_size"))) -}}
{{- $e = index $values "ensemble_size" -}}
{{- end -}}
{{- end -}}
{{- int64 $e -}}
{{- end -}}
