"""The llm-d router's config contract, per router line, for every plugin type and parameter we use.

One table so an upstream rename is one edit. Each entry is read from the router's source (repository
llm-d/llm-d-router) with the commit it was read at; the router decodes plugin parameters strictly
(pkg/epp/config/loader/configloader.go @ 03fdf919: `fwkplugin.StrictDecoder(spec.Parameters)`, and the
whole document with `serializer.EnableStrict`), so a key not listed here is refused at start-up.

Lines: "v0.10" = the v0.10.x releases (v0.10.0 tagged 2026-08-18); "main" = the main branch after the
attribute/producer split (mid-August 2026). Which commit belongs to which line is inferred from the code
read (the combined "Attribute/Producer" spelling resolved by ResolveScalarMetricAttribute vs the `producer`
field that rejects it), not from a tag listing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# --- facts shared by both lines ------------------------------------------------------------------------

# pkg/epp/framework/plugins/datalayer/attribute/gpu/data_types.go @ 2b0e7579:
#   DCGMExtractorType = "dcgm-extractor"; GPUUtilizationDataKey = NewDataKey("GPUUtilization", DCGMExtractorType)
GPU_ATTRIBUTE = "GPUUtilization"
GPU_PRODUCER = "dcgm-extractor"
# pkg/epp/framework/plugins/datalayer/extractor/dcgm/extractor.go @ 25998b95: gpuUtilMetricName, podLabelName;
# samples with a `pod` label equal to the endpoint's PodName (file discovery: the entry's name) are kept.
# The version the generic filter/scorer can read publishes attrmetrics.ScalarMetricValue (and errors on a
# sample that is not a gauge): the 25998b95 version stored a GPUUtilization type the generic plugins cannot read.
FEED_METRIC = "DCGM_FI_DEV_GPU_UTIL"
FEED_POD_LABEL = "pod"
# pkg/epp/framework/plugins/scheduling/filter/bylabel/roles.go @ 533a218d: RoleLabel and the values the
# prefill/decode filters accept (decode-filter also passes endpoints without the label).
ROLE_LABEL = "llm-d.ai/role"
ROLE_VALUES = frozenset({"prefill", "decode", "prefill-decode", "encode", "encode-prefill", "encode-prefill-decode"})

_DCGM_SOURCE = frozenset(
    # pkg/epp/framework/plugins/datalayer/source/dcgm/datasource.go (dcgmDatasourceParams, the version with
    # UseNodeAddress; README @ c182968f). No `interval`: the scrape period is a dataLayer/base-tick setting.
    {"scheme", "path", "port", "insecureSkipVerify", "useNodeAddress"}
)
_THRESHOLD = frozenset({"algorithm.type", "algorithm.threshold.operator", "algorithm.threshold.value"})
_FILTER_COMMON = frozenset({"attribute", "onMissing", "fallbackOnEmpty"}) | _THRESHOLD
# pkg/epp/framework/plugins/scheduling/scorer/endpointattribute/endpointattribute.go @ 2b0e7579
_SCORER_COMMON = frozenset(
    {
        "attributeKey",
        "algorithm.type",
        "algorithm.normalization.fixedRange.min",
        "algorithm.normalization.fixedRange.max",
    }
)
_NO_PARAMETERS: frozenset[str] = frozenset()
_SHARED: dict[str, frozenset[str]] = {
    "dcgm-data-source": _DCGM_SOURCE,
    "dcgm-extractor": _NO_PARAMETERS,  # extractor/dcgm/extractor.go @ 25998b95: the factory ignores parameters
    # scorer/prefix/plugin.go (config struct); we set none: the defaults (block size auto-tuned)
    "prefix-cache-scorer": _NO_PARAMETERS,
    "queue-scorer": _NO_PARAMETERS,
    "max-score-picker": _NO_PARAMETERS,
    # filter/bylabel/roles.go @ 533a218d: PrefillRoleFactory / DecodeRoleFactory take no parameters
    "prefill-filter": _NO_PARAMETERS,
    "decode-filter": _NO_PARAMETERS,
    # profilehandler/disagg/prefix_based_pd_decider.go: PrefixBasedPDDeciderConfig{nonCachedTokens, promptTokens}
    "prefix-based-pd-decider": frozenset({"nonCachedTokens"}),
    # profilehandler/disagg/disagg_profile_handler.go: DisaggProfileHandlerParameters{stageOrder, profiles, deciders}
    "disagg-profile-handler": frozenset({"deciders.prefill"}),
    # datalayer/discovery/file/plugin.go @ 06986a05: params{path, watchFile}
    "file-discovery": frozenset({"path", "watchFile"}),
}


@dataclass(frozen=True)
class RouterLine:
    name: str
    versions: str  # as docs/telemetry.md states it
    plugins: dict[str, frozenset[str]]  # plugin type -> dotted parameter paths it accepts (those we use)
    combined_attribute: bool  # True: attribute/attributeKey = "GPUUtilization/dcgm-extractor", no producer
    discovery_ref: tuple[str, ...]  # where dataLayer names the discovery plugin
    data_layer_keys: frozenset[str] = field(default_factory=lambda: frozenset({"sources", "discovery"}))


LINES: dict[str, RouterLine] = {
    "v0.10": RouterLine(
        name="v0.10",
        versions="v0.10.0 and later v0.10.x",
        plugins={
            **_SHARED,
            # filter/endpointattribute/filter.go @ 03a70c3b: parameters{attribute, onMissing, fallbackOnEmpty,
            # algorithm{type, threshold{operator, value}}}; no producer. The attribute is resolved by
            # attribute/metrics/data_types.go @ a335e024 ResolveScalarMetricAttribute: "a name that carries a
            # producer -- e.g. GPUUtilization/dcgm-extractor -- addresses that producer's attribute".
            "endpoint-attribute-filter": _FILTER_COMMON,
            "endpoint-attribute-scorer": _SCORER_COMMON,
        },
        combined_attribute=True,
        # datalayer/discovery/file/README.md @ 93421cc8: "Location: dataLayer.discovery.pluginRef";
        # apix/config/v1alpha1/endpointpickerconfig_types.go @ 98f9aa0d: DiscoveryConfig{PluginRef}
        discovery_ref=("discovery", "pluginRef"),
    ),
    "main": RouterLine(
        name="main",
        versions="main after mid-August 2026 (no release yet)",
        plugins={
            **_SHARED,
            # filter/endpointattribute/filter.go @ 8e3dc6ac: Producer *string `json:"producer"`, resolved by
            # attrmetrics.ResolveConfiguredKey, which rejects the combined spelling ("split it into attribute:
            # \"GPUUtilization\" and producer: \"dcgm-extractor\"").
            "endpoint-attribute-filter": _FILTER_COMMON | {"producer"},
            # the router's own e2e gpuUtilConfig on main: attributeKey "GPUUtilization" + producer "dcgm-extractor"
            "endpoint-attribute-scorer": _SCORER_COMMON | {"producer"},
        },
        combined_attribute=False,
        # datalayer/discovery/file/README.md @ 25eaa393: dataLayer.discovery.endpoints.pluginRef (with the
        # peer-discovery split), and the runner's test reads conf.DataLayer.Discovery.Endpoints.PluginRef.
        # Dating: a review on llm-d-router pull 2341 (2026-08-13) still names dataLayer.discovery.pluginRef as
        # the way, and pull 2501 (2026-08-26) adds DataLayer.Discovery.Peers: the split came after v0.10.0.
        discovery_ref=("discovery", "endpoints", "pluginRef"),
    ),
}

# deploy/epp/<file> -> the router line it is for
CONFIGS: dict[str, str] = {
    "endpoint-picker-config.yaml": "main",
    "endpoint-picker-config-v0.10.yaml": "v0.10",
    "file-discovery-main.yaml": "main",
    "file-discovery-v0.10.yaml": "v0.10",
}
