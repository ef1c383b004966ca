{{/*
Labels of every object: the manifests' app.kubernetes.io/name and part-of, plus Helm's own.
Call with (dict "name" "vgpu-extender" "root" $).
*/}}
{{- define "kube-vgpu.labels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/part-of: kube-vgpu
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Pod template labels: exactly the manifests' (selectors use app.kubernetes.io/name only). */}}
{{- define "kube-vgpu.podLabels" -}}
app.kubernetes.io/name: {{ . }}
app.kubernetes.io/part-of: kube-vgpu
{{- end }}

{{/* The kube-vgpu image: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "kube-vgpu.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The extender's in-cluster URL, as kube-scheduler calls it. */}}
{{- define "kube-vgpu.extenderURL" -}}
https://vgpu-extender.{{ .Release.Namespace }}.svc:{{ .Values.extender.port }}
{{- end }}

{{/* The webhook's DNS names (certificate SANs). */}}
{{- define "kube-vgpu.webhookHosts" -}}
- vgpu-webhook
- vgpu-webhook.{{ .Release.Namespace }}
- vgpu-webhook.{{ .Release.Namespace }}.svc
- vgpu-webhook.{{ .Release.Namespace }}.svc.cluster.local
{{- end }}

{{/* The resource names the webhook configurations match on, as a CEL list literal. */}}
{{- define "kube-vgpu.celResources" -}}
{{- $r := .Values.resourceNames -}}
[{{ list $r.count $r.memory $r.memoryPercentage $r.cores $r.priority | join "', '" | printf "'%s'" }}]
{{- end }}

{{/* imagePullSecrets of a pod spec, when any. */}}
{{- define "kube-vgpu.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* nodeSelector, tolerations and affinity of a pod spec, from one component's values. */}}
{{- define "kube-vgpu.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A list of strings as a CEL list literal, e.g. ['a', 'b']; [] when empty. */}}
{{- define "kube-vgpu.celStrings" -}}
{{- if . -}}
[{{ . | join "', '" | printf "'%s'" }}]
{{- else -}}
[]
{{- end -}}
{{- end }}
