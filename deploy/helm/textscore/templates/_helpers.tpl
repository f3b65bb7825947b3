{{/* Names, labels, images and the numbers several templates share. */}}

{{- define "textscore.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name; 45 characters leave room for the ReplicaSet and pod suffixes. */}}
{{- define "textscore.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "textscore.selectorLabels" -}}
app.kubernetes.io/name: {{ include "textscore.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "textscore.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "textscore.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: textscore
{{- end }}

{{- define "textscore.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "textscore.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "registry/repository:tag" of images.<name>; the gateway's tag defaults to the appVersion. */}}
{{- define "textscore.image" -}}
{{- $image := index .root.Values.images .name }}
{{- $tag := $image.tag | default .root.Chart.AppVersion }}
{{- if .root.Values.images.registry }}
{{- printf "%s/%s:%s" (trimSuffix "/" .root.Values.images.registry) $image.repository $tag }}
{{- else }}
{{- printf "%s:%s" $image.repository $tag }}
{{- end }}
{{- end }}

{{- define "textscore.apiKeysSecretName" -}}
{{- .Values.apiKeys.existingSecret | default (printf "%s-api-keys" (include "textscore.fullname" .)) }}
{{- end }}

{{/* Anchored regex of this Deployment's pod names (<fullname>-<template hash>-<5 chars>) for
     PromQL: another release whose name starts the same way never matches. */}}
{{- define "textscore.podRegex" -}}
{{- printf "%s-[a-z0-9]+-[a-z0-9]{5}" (include "textscore.fullname" .) }}
{{- end }}

{{/* Where Triton reads the repository: a local folder or an object-store URL. */}}
{{- define "textscore.modelRepositoryPath" -}}
{{- $source := .Values.modelRepository.source }}
{{- if eq $source "objectStore" }}
{{- required "modelRepository.objectStore.url is required with source objectStore" .Values.modelRepository.objectStore.url }}
{{- else if eq $source "volume" }}
{{- printf "/models/%s" (trimPrefix "/" .Values.modelRepository.volume.path) }}
{{- else }}
{{- /* deploy/builder/build.sh: served_repository=/models/repository */ -}}
/models/repository
{{- end }}
{{- end }}

{{/* /dev/shm's size: the Python-backend instances (preprocess, on every GPU, or once per pod on
     KIND_CPU) plus the gateway's shared-memory pool plus headroom, in MiB rounded up. */}}
{{- define "textscore.shmSizeLimit" -}}
{{- if .Values.shm.sizeLimit }}
{{- .Values.shm.sizeLimit }}
{{- else }}
{{- $devices := max 1 (int .Values.gpu.count) }}
{{- $python := mul (int .Values.modelRepository.instances.preprocess) $devices (int64 .Values.shm.pythonBackendBytesPerInstance) }}
{{- $pool := mul (int .Values.gateway.shm.poolSize) (int64 .Values.gateway.shm.regionBytes) }}
{{- $total := add $python $pool (int64 .Values.shm.headroomBytes) }}
{{- printf "%dMi" (div (add $total 1048575) 1048576) }}
{{- end }}
{{- end }}

{{/* The longest the gateway's preStop hook can take (propagation wait + drain). */}}
{{- define "textscore.gatewayPreStopSeconds" -}}
{{- add (int .Values.lifecycle.endpointPropagationSeconds) (int .Values.lifecycle.drainTimeoutSeconds) }}
{{- end }}

{{/* Triton's preStop waits for the gateway to be gone: its preStop, then its shutdown. */}}
{{- define "textscore.tritonPreStopSeconds" -}}
{{- add (include "textscore.gatewayPreStopSeconds" . | int) (int .Values.lifecycle.gatewayShutdownSeconds) }}
{{- end }}

{{/* Every step of termination plus 10 s; an explicit value must exceed that sum. */}}
{{- define "textscore.terminationGracePeriodSeconds" -}}
{{- $needed := add (include "textscore.tritonPreStopSeconds" . | int) (int .Values.triton.exitTimeoutSeconds) }}
{{- $explicit := int .Values.lifecycle.terminationGracePeriodSeconds }}
{{- if eq $explicit 0 }}
{{- add $needed 10 }}
{{- else if le $explicit $needed }}
{{- fail (printf "lifecycle.terminationGracePeriodSeconds (%d) must exceed the drain and shutdown steps (%d s)" $explicit $needed) }}
{{- else }}
{{- $explicit }}
{{- end }}
{{- end }}

{{/* The Prometheus label matchers that select this release's pods (KEDA's query). */}}
{{- define "textscore.promSelector" -}}
{{- printf "namespace=\"%s\", pod=~\"%s\"" .Release.Namespace (include "textscore.podRegex" .) }}
{{- end }}

{{/* Queue time per request over this release's pods, in microseconds: the time requests waited
     in the queues of the ensembles' steps, per request answered by an ensemble. Zero when idle
     (clamp_min keeps 0/0 from becoming NaN). docs/kubernetes.md derives it. */}}
{{- define "textscore.queueTimeQuery" -}}
{{- $selector := include "textscore.promSelector" . }}
{{- $window := .Values.autoscaling.rateWindow }}
{{- $steps := join "|" .Values.modelRepository.composingModels }}
{{- $ensembles := join "|" .Values.modelRepository.ensembles }}
{{- /* Every pipeline version N serves its models as <name>_vN: match them all. */}}
{{- printf "sum(rate(nv_inference_queue_duration_us{%s, model=~\"(%s)_v[0-9]+\"}[%s])) / clamp_min(sum(rate(nv_inference_request_success{%s, model=~\"(%s)_v[0-9]+\"}[%s])), 0.001)" $selector $steps $window $selector $ensembles $window }}
{{- end }}

{{/* Refusals: settings that would render a pod that cannot work. */}}
{{- define "textscore.validate" -}}
{{- if not (or .Values.apiKeys.existingSecret .Values.apiKeys.digests) }}
{{- fail "set apiKeys.digests (entries 'sha256hex:scope+scope') or apiKeys.existingSecret: without keys the gateway refuses every API call" }}
{{- end }}
{{- if lt (int .Values.lifecycle.drainTimeoutSeconds) (int (ceil .Values.gateway.requestTimeoutSeconds)) }}
{{- fail "lifecycle.drainTimeoutSeconds must be at least gateway.requestTimeoutSeconds: a request that started just before the drain must be able to finish" }}
{{- end }}
{{- $triton := list (int .Values.triton.ports.http) (int .Values.triton.ports.grpc) (int .Values.triton.ports.metrics) }}
{{- if has (int .Values.gateway.port) $triton }}
{{- fail "gateway.port must differ from every triton.ports entry: both containers share the pod's network namespace" }}
{{- end }}
{{- if eq .Values.gateway.transport "cuda_shm" }}
{{- if not (and .Values.gateway.gpu.enabled (gt (int .Values.gpu.count) 0)) }}
{{- fail "gateway.transport cuda_shm needs gpu.count > 0 and gateway.gpu.enabled (a GPU shared with Triton)" }}
{{- end }}
{{- end }}
{{- if and .Values.autoscaling.enabled (not .Values.triton.exposeMetrics) }}
{{- fail "autoscaling reads Triton's queue-time metrics: it needs triton.exposeMetrics" }}
{{- end }}
{{- $minAvailable := toString .Values.podDisruptionBudget.minAvailable }}
{{- if and .Values.podDisruptionBudget.enabled $minAvailable (not (hasSuffix "%" $minAvailable)) }}
{{- /* A percentage ("50%") scales with the replicas; a number is an absolute floor. */ -}}
{{- $floor := ternary .Values.autoscaling.minReplicas .Values.replicaCount .Values.autoscaling.enabled }}
{{- if ge (int $minAvailable) (int $floor) }}
{{- fail "podDisruptionBudget.minAvailable must be below the replica count (autoscaling.minReplicas with autoscaling): otherwise no node could ever be drained" }}
{{- end }}
{{- end }}
{{- end }}

{{/* TRITON_INSTANCES for the builder: "MODEL=N" for each composing model, space-separated. */}}
{{- define "textscore.instances" -}}
{{- $items := list }}
{{- range .Values.modelRepository.composingModels }}
{{- $items = append $items (printf "%s=%d" . (int (index $.Values.modelRepository.instances .))) }}
{{- end }}
{{- join " " $items }}
{{- end }}
