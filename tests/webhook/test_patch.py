"""The patch for every shape of pod, applied with a JSONPatch library (RFC
6902) to the pod and checked; which pods and containers are chosen; the
config file's errors. Pure functions, tables of cases."""

import copy

import jsonpatch
import jsonpointer
import pytest
from hypothesis import given
from hypothesis import strategies as st

from powerdev.config import ConfigError
from powerdev.webhook.config import WebhookConfig, parse_webhook_config
from powerdev.webhook.patch import BadPod, decide, escape
from tests.webhook.conftest import NAMESPACE, RESOURCE, container, deployment_pod

DEFAULT = WebhookConfig()


def mutated(pod: dict, config: WebhookConfig = DEFAULT, namespace: str = "team-a") -> dict:
    decision = decide(pod, namespace, config, own_namespace=NAMESPACE)
    return jsonpatch.apply_patch(pod, decision.patch)  # raises on any bad path


def with_resource(c: dict, resource: str = RESOURCE, quantity: str = "1") -> dict:
    """What the container should look like after the webhook."""
    c = copy.deepcopy(c)
    resources = c.get("resources") or {}
    for key in ("limits", "requests"):
        resources[key] = {**(resources.get(key) or {}), resource: quantity}
    c["resources"] = resources
    return c


SHAPES = {
    "resources {} (what the API server sends for none)": "{}",
    "no resources key": None,
    "limits and requests null": {"limits": None, "requests": None},
    "requests only": {"requests": {"cpu": "100m", "memory": "64Mi"}},
    "limits only": {"limits": {"cpu": "1", "memory": "1Gi"}},
    "limits and requests with other keys": {
        "limits": {"cpu": "1", "memory": "1Gi", "example.com/fpga": "2"},
        "requests": {"cpu": "500m", "memory": "512Mi", "example.com/fpga": "2"},
    },
    "limits null, requests set": {"limits": None, "requests": {"cpu": "1"}},
    "claims and empty limits": {"limits": {}, "claims": [{"name": "gpu"}]},
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=list(SHAPES))
def test_each_shape_gets_the_resource_and_keeps_everything_else(shape):
    pod = deployment_pod(container("db", shape), container("metrics", shape))
    after = mutated(pod)
    expected = copy.deepcopy(pod)
    expected["spec"]["containers"] = [with_resource(c) for c in pod["spec"]["containers"]]
    assert after == expected


def test_a_resources_null_container_gets_both_maps():
    pod = deployment_pod(container("db", None))
    pod["spec"]["containers"][0]["resources"] = None
    after = mutated(pod)["spec"]["containers"][0]["resources"]
    assert after == {"limits": {RESOURCE: "1"}, "requests": {RESOURCE: "1"}}


def test_the_slash_in_the_resource_name_is_escaped_in_the_path():
    pod = deployment_pod(container("db", {"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}))
    decision = decide(pod, "team-a", DEFAULT, own_namespace=NAMESPACE)
    assert [op["path"] for op in decision.patch] == [
        "/spec/containers/0/resources/limits/power-dev-plugin~1dev",
        "/spec/containers/0/resources/requests/power-dev-plugin~1dev",
    ]
    # the seed's bug class: an unescaped path makes a nested object instead
    wrong = [dict(op, path=op["path"].replace("~1", "/")) for op in decision.patch]
    with pytest.raises(jsonpointer.JsonPointerException, match="'power-dev-plugin' not found"):
        jsonpatch.apply_patch(pod, wrong)


def test_escape_follows_rfc_6901():
    assert escape("a/b~c") == "a~1b~0c"
    assert escape("~1") == "~01"  # '~' first, so a literal "~1" stays itself


def test_count_and_another_resource_name():
    config = parse_webhook_config(
        '{"resource": "accel.example.com/nx-gzip.v2", "count": 3}', source="t"
    )
    pod = deployment_pod(container("db", {"limits": {"cpu": "1"}}))
    (c,) = mutated(pod, config)["spec"]["containers"]
    assert c["resources"] == {
        "limits": {"cpu": "1", "accel.example.com/nx-gzip.v2": "3"},
        "requests": {"accel.example.com/nx-gzip.v2": "3"},
    }


@pytest.mark.parametrize(
    "resources",
    [{"limits": {RESOURCE: "2"}}, {"requests": {RESOURCE: "1"}, "limits": {RESOURCE: "1"}}],
)
def test_a_container_that_asks_already_is_left_alone(resources):
    pod = deployment_pod(container("db", resources), container("sidecar"))
    after = mutated(pod)
    assert after["spec"]["containers"][0] == pod["spec"]["containers"][0]
    assert after["spec"]["containers"][1] == with_resource(pod["spec"]["containers"][1])


def test_a_pod_whose_containers_all_ask_gets_no_patch():
    pod = deployment_pod(container("db", {"limits": {RESOURCE: "1"}}))
    decision = decide(pod, "team-a", DEFAULT, own_namespace=NAMESPACE)
    assert decision.patch == [] and "no chosen container" in decision.reason


def test_containers_named_in_the_annotation():
    pod = deployment_pod(
        container("a"),
        container("b"),
        container("c"),
        annotations={"power-dev-plugin/containers": " c , a,missing"},
    )
    after = mutated(pod)["spec"]["containers"]
    assert [RESOURCE in (c["resources"].get("limits") or {}) for c in after] == [True, False, True]


def test_init_containers_only_when_configured():
    pod = deployment_pod(container("app"), init=[container("setup"), container("migrate")])
    after = mutated(pod)
    assert after["spec"]["initContainers"] == pod["spec"]["initContainers"]
    config = parse_webhook_config('{"init-containers": true}', source="t")
    after = mutated(pod, config)
    assert after["spec"]["initContainers"] == [
        with_resource(c) for c in pod["spec"]["initContainers"]
    ]
    assert after["spec"]["containers"] == [with_resource(pod["spec"]["containers"][0])]


@pytest.mark.parametrize(
    "namespace", [NAMESPACE, "kube-system", "openshift", "openshift-monitoring", "openshift-x"]
)
def test_protected_namespaces_are_never_mutated(namespace):
    decision = decide(deployment_pod(container("a")), namespace, DEFAULT, own_namespace=NAMESPACE)
    assert decision.patch == [] and "never mutated" in decision.reason


def test_namespaces_that_only_look_alike_are_mutated():
    for namespace in ("openshiftish", "kube-system-apps", "my-openshift-x"):
        assert decide(
            deployment_pod(container("a")), namespace, DEFAULT, own_namespace=NAMESPACE
        ).patch


@pytest.mark.parametrize(
    ("config", "metadata", "chosen"),
    [
        ("{}", {}, True),
        ("{}", {"annotations": {"power-dev-plugin/inject": "false"}}, False),
        ('{"require-annotation": true}', {}, False),
        (
            '{"require-annotation": true}',
            {"annotations": {"power-dev-plugin/inject": "yes"}},
            False,
        ),
        (
            '{"require-annotation": true}',
            {"annotations": {"power-dev-plugin/inject": "true"}},
            True,
        ),
        ('{"pod-labels": {"app": "db"}}', {}, True),
        ('{"pod-labels": {"app": "web"}}', {}, False),
        ('{"pod-labels": {"app": "db", "tier": "data"}}', {"labels": {"tier": "data"}}, True),
        ('{"pod-labels": {"app": "db", "tier": "data"}}', {"labels": {"tier": "x"}}, False),
        (
            '{"pod-labels": {"app": "db"}}',
            {"annotations": {"power-dev-plugin/inject": "false"}},
            False,
        ),
    ],
)
def test_which_pods_are_chosen(config, metadata, chosen):
    pod = deployment_pod(container("a"), **metadata)
    decision = decide(pod, "team-a", parse_webhook_config(config, source="t"), own_namespace="x")
    assert bool(decision.patch) is chosen, decision.reason


@pytest.mark.parametrize(
    ("pod", "problem"),
    [
        ("a string", "not a JSON object"),
        ({"metadata": {}}, "no spec"),
        ({"spec": {"containers": "db"}}, "not a list of named containers"),
        ({"spec": {"containers": [{"image": "x"}]}}, "not a list of named containers"),
        ({"spec": {"containers": [{"name": "a", "resources": []}]}}, "resources is not an object"),
        (
            {"spec": {"containers": [{"name": "a", "resources": {"limits": "1"}}]}},
            "resources.limits is not an object",
        ),
        ({"metadata": {"labels": ["a"]}, "spec": {"containers": []}}, "labels is not an object"),
    ],
)
def test_unreadable_pods_raise_bad_pod(pod, problem):
    with pytest.raises(BadPod, match=problem):
        decide(pod, "team-a", DEFAULT, own_namespace=NAMESPACE)


# any mixture of shapes: the patch applies, and every container ends up asking exactly once
_part = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["cpu", "memory", "example.com/x", RESOURCE]), st.just("1")),
)
_resources = st.one_of(
    st.just("{}"),
    st.none(),
    st.fixed_dictionaries({}, optional={"limits": _part, "requests": _part}),
)


@given(st.lists(_resources, min_size=1, max_size=4), st.integers(1, 8))
def test_property_every_mixture_of_shapes(shapes, count):
    config = WebhookConfig(count=count)
    pod = deployment_pod(*(container(f"c{i}", s) for i, s in enumerate(shapes)))
    after = mutated(pod, config)
    for before, now in zip(pod["spec"]["containers"], after["spec"]["containers"], strict=True):
        old = before.get("resources") or {}
        asked = any(RESOURCE in (old.get(k) or {}) for k in ("limits", "requests"))
        if asked:
            assert now == before
        else:
            assert now == with_resource(before, quantity=str(count))


@pytest.mark.parametrize(
    ("text", "field", "fix"),
    [
        ('{"count": 0}', "'count'", "like 1"),
        ('{"count": "1"}', "'count'", "like 1"),
        ('{"count": true}', "'count'", "like 1"),
        ('{"count": 5000}', "'count'", "from 1 to 1024"),
        ('{"resource": "dev"}', "'resource'", "domain prefix"),
        ('{"resource": 3}', "'resource'", "must be a string"),
        ('{"pod-labels": []}', "'pod-labels'", "or {} for every pod"),
        ('{"pod-labels": {"app": 1}}', "'pod-labels'", "quote it"),
        ('{"pod-labels": {"-bad": "x"}}', "'pod-labels'", "valid Kubernetes label"),
        ('{"pod-labels": {"app": "has space"}}', "'pod-labels'", "valid Kubernetes label"),
        ('{"init-containers": "yes"}', "'init-containers'", "true or false"),
        ('{"init-container": true}', "'init-container'", "use only resource, count"),
    ],
)
def test_config_errors_name_the_file_the_field_and_the_fix(text, field, fix):
    with pytest.raises(ConfigError) as err:
        parse_webhook_config(text, source="/etc/w/webhook.json")
    message = str(err.value)
    assert message.startswith(f"/etc/w/webhook.json: field {field}: ")
    assert fix in message


@pytest.mark.parametrize("text", ["[1]", "{", '"x"', "[" * 100000])
def test_config_that_is_not_a_json_object(text):
    with pytest.raises(ConfigError, match=r"^/w\.json: is not"):
        parse_webhook_config(text, source="/w.json")


def test_empty_config_is_the_defaults():
    assert parse_webhook_config("", source="t") == WebhookConfig()
    assert parse_webhook_config("{}", source="t") == WebhookConfig()
