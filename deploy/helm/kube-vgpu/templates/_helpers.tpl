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

{{/* The extender's DNS names (serving certificate SANs); kube-scheduler calls the .svc one. */}}
{{- define "kube-vgpu.extenderHosts" -}}
- vgpu-extender
- vgpu-extender.{{ .Release.Namespace }}
- vgpu-extender.{{ .Release.Namespace }}.svc
- vgpu-extender.{{ .Release.Namespace }}.svc.cluster.local
{{- end }}

{{/* The annotation on the generated Secrets that records when their certificates expire (RFC 3339, UTC). */}}
{{- define "kube-vgpu.notAfterKey" -}}
kube-vgpu/certificates-not-after
{{- end }}

{{/*
The extender's certificates in extender.tls.mode generate, as YAML {notAfter, caCrt, serverCrt, serverKey,
clientCrt, clientKey} (base64 PEM, as Secret data). One CA signs the extender's serving certificate and
kube-scheduler's client certificate; the CA's key is thrown away.
Kept from the two existing Secrets (`lookup`) when both hold every key, share one CA, carry the same notAfter
and more than generate.renewBeforeDays are left; otherwise all three are issued anew. Without a cluster
(`helm template`, client-side dry runs) lookup finds nothing, so every such rendering issues new ones.
Made once per rendering: memoized in .Values, so both Secrets and both Deployments' checksums agree.
Sprig's genSignedCert* give every certificate the extended key usages serverAuth and clientAuth
(github.com/Masterminds/sprig v3.3.0 crypto.go, the helm v3.22.0 dependency); the extender and kube-scheduler
check the CA, not the usage.
*/}}
{{- define "kube-vgpu.extenderGeneratedTLS" -}}
{{- if not (hasKey .Values "__extenderGeneratedTLS") }}
{{- $tls := .Values.extender.tls }}
{{- $ns := .Release.Namespace }}
{{- $key := include "kube-vgpu.notAfterKey" . }}
{{- $server := lookup "v1" "Secret" $ns $tls.secretName | default dict }}
{{- $client := lookup "v1" "Secret" $ns $tls.clientSecretName | default dict }}
{{- $sd := get $server "data" | default dict }}
{{- $cd := get $client "data" | default dict }}
{{- $sNotAfter := get (get (get $server "metadata" | default dict) "annotations" | default dict) $key | default "" }}
{{- $cNotAfter := get (get (get $client "metadata" | default dict) "annotations" | default dict) $key | default "" }}
{{- $keep := false }}
{{- if and $sNotAfter (eq $sNotAfter $cNotAfter) (hasKey $sd "tls.crt") (hasKey $sd "tls.key") (hasKey $sd "ca.crt") (hasKey $cd "tls.crt") (hasKey $cd "tls.key") (hasKey $cd "ca.crt") }}
{{- if eq (get $sd "ca.crt") (get $cd "ca.crt") }}
{{- $renewAt := sub (toDate "2006-01-02T15:04:05Z07:00" $sNotAfter | unixEpoch | int64) (mul (int64 $tls.generate.renewBeforeDays) 86400) }}
{{- $keep = lt (now | unixEpoch | int64) $renewAt }}
{{- end }}
{{- end }}
{{- if $keep }}
{{- $_ := set .Values "__extenderGeneratedTLS" (dict "notAfter" $sNotAfter "caCrt" (get $sd "ca.crt") "serverCrt" (get $sd "tls.crt") "serverKey" (get $sd "tls.key") "clientCrt" (get $cd "tls.crt") "clientKey" (get $cd "tls.key")) }}
{{- else }}
{{- $days := int $tls.generate.validityDays }}
{{- /* Taken before issuing, so it is never later than the certificates' own NotAfter (now + days). */}}
{{- $notAfter := dateInZone "2006-01-02T15:04:05Z" (now | dateModify (printf "+%dh" (mul $days 24))) "UTC" }}
{{- $ca := genCAWithKey "vgpu-extender-ca" $days (genPrivateKey "ecdsa") }}
{{- $hosts := include "kube-vgpu.extenderHosts" . | fromYamlArray }}
{{- $srv := genSignedCertWithKey "vgpu-extender" nil $hosts $days $ca (genPrivateKey "ecdsa") }}
{{- $cli := genSignedCertWithKey "vgpu-scheduler" nil nil $days $ca (genPrivateKey "ecdsa") }}
{{- $_ := set .Values "__extenderGeneratedTLS" (dict "notAfter" $notAfter "caCrt" ($ca.Cert | b64enc) "serverCrt" ($srv.Cert | b64enc) "serverKey" ($srv.Key | b64enc) "clientCrt" ($cli.Cert | b64enc) "clientKey" ($cli.Key | b64enc)) }}
{{- end }}
{{- end }}
{{- toYaml (get .Values "__extenderGeneratedTLS") }}
{{- end }}

{{/* Pod template annotation that rolls a Deployment when the generated extender certificates change. */}}
{{- define "kube-vgpu.extenderTLSChecksum" -}}
{{- if and .Values.extender.enabled (eq .Values.extender.tls.mode "generate") -}}
checksum/extender-tls: {{ include "kube-vgpu.extenderGeneratedTLS" . | sha256sum }}
{{- end }}
{{- end }}
