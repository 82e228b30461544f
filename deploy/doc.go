// Package deploy holds what operators run beside a gateway: the Grafana dashboards
// (grafana/*.json, provisioned with grafana/provider.yaml) and the Prometheus alerting
// rules (prometheus/alerts.yaml, unit-tested by prometheus/alerts_test.yaml); Files
// embeds them. Its tests keep them from rotting: promtool (built from the Prometheus
// module, package internal/promtooltest) checks and unit-tests the rules, and every metric
// a dashboard panel or a rule uses, and every label it selects or groups by, must be one
// that a running gateway exports once it has served some traffic. docs/operations.md says
// how to install them.
package deploy

import "embed"

// Files holds the dashboards (grafana/loops-*.json), the Grafana provider
// (grafana/provider.yaml) and the alerting rules with their unit tests
// (prometheus/alerts.yaml, prometheus/alerts_test.yaml).
//
//go:embed grafana/*.json grafana/provider.yaml prometheus/*.yaml
var Files embed.FS
