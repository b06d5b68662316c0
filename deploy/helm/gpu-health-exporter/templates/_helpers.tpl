{{/* The object name: the release name when it contains the chart's, else RELEASE-CHART. */}}
{{- define "ghe.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ghe.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ghe.labels" -}}
{{ include "ghe.selectorLabels" . }}
app.kubernetes.io/part-of: {{ .Chart.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ghe.image" -}}
{{- $v := .Values.image -}}
{{- if $v.digest -}}
{{ $v.repository }}@{{ $v.digest }}
{{- else -}}
{{ $v.repository }}:{{ $v.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* Whether a Prometheus Operator object renders: ARGS (list $ "Kind" .enabled). auto: only where the
API server serves the kind (helm template: only with --api-versions monitoring.coreos.com/v1/KIND). */}}
{{- define "ghe.monitoring" -}}
{{- $ctx := index . 0 -}}{{- $kind := index . 1 -}}{{- $on := index . 2 | toString -}}
{{- $served := $ctx.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" $kind) -}}
{{- if or (eq $on "true") (and (eq $on "auto") $served) -}}
true
{{- end -}}
{{- end -}}

{{/* A map of resource quantities, each quoted: Helm 4's server-side apply refuses a number (a
`--set resources.requests.cpu=1`) where a quantity goes. */}}
{{- define "ghe.quantities" -}}
{{- $lines := list -}}
{{- range $k, $v := . -}}
{{- $lines = append $lines (printf "%s: %s" $k ($v | quote)) -}}
{{- end -}}
{{ join "\n" $lines }}
{{- end -}}

{{- define "ghe.nodeAffinity" -}}
{{- $s := .Values.nodeSelection -}}
{{- if not (or $s.instanceTypes $s.labels) -}}
{{- fail "nodeSelection: no instance type and no label selects a node (or set affinity)" -}}
{{- end -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      {{- with $s.instanceTypes }}
      - matchExpressions:
          - key: node.kubernetes.io/instance-type
            operator: In
            values:
              {{- toYaml . | nindent 14 }}
      {{- end }}
      {{- range $s.labels }}
      - matchExpressions:
          - key: {{ .key | quote }}
            operator: In
            values:
              {{- toYaml .values | nindent 14 }}
      {{- end }}
{{- end -}}

{{- define "ghe.activeImage" -}}
{{- $v := .Values.activeChecks.image -}}
{{- if not $v.repository -}}
{{ include "ghe.image" . }}
{{- else if $v.digest -}}
{{ $v.repository }}@{{ $v.digest }}
{{- else -}}
{{ $v.repository }}:{{ $v.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "ghe.activeSelectorLabels" -}}
app.kubernetes.io/name: gpu-health-active-check
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
