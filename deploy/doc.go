// Package deploy holds llmgate's deployment files: the container image
// (Dockerfile), a compose setup with three replicas behind nginx, a
// Kubernetes kustomize base (k8s/), Prometheus alert rules and a Grafana
// dashboard. It has no code of its own; deploy_test.go checks that the
// files agree with each other and with what the gateway binary serves and
// reads. See README.md.
package deploy
