import copy

import pytest

from gateway.redaction import InvalidPointerError, remove_pointers
from gateway.redaction.pointers import parse_pointer


def chat_document() -> dict:
    return {
        "tenant": "contoso",
        "request": {
            "model": "demo",
            "messages": [
                {"role": "system", "content": "Be brief.", "name": "sys"},
                {"role": "user", "content": "Hello", "name": "alice"},
                {"role": "assistant", "content": "Hi"},
            ],
            "user": "alice@contoso.com",
        },
        "a/b": 1,
        "m~n": 2,
        "": "empty key",
        "metadata": {"team": "finance", "cost_centre": "42"},
    }


@pytest.mark.parametrize(
    ("pointer", "tokens"),
    [
        ("", ()),
        ("/", ("",)),
        ("/request/messages", ("request", "messages")),
        ("/a~1b", ("a/b",)),
        ("/m~0n", ("m~n",)),
        ("/~01", ("~1",)),  # "~0" is unescaped last, so "~01" means "~1", not "/"
        ("/request/messages/*/name", ("request", "messages", "*", "name")),
    ],
)
def test_parse_pointer_unescapes_tokens(pointer: str, tokens: tuple[str, ...]) -> None:
    assert parse_pointer(pointer) == tokens


@pytest.mark.parametrize("pointer", ["request", "request/user", "/a~2b", "/a~", 7])
def test_malformed_pointer_is_refused_without_echoing_it(pointer: object) -> None:
    with pytest.raises(InvalidPointerError) as caught:
        remove_pointers(chat_document(), [pointer])
    if isinstance(pointer, str):
        assert pointer not in str(caught.value)


def test_a_single_string_is_not_taken_as_a_list_of_pointers() -> None:
    with pytest.raises(InvalidPointerError):
        remove_pointers(chat_document(), "/request/user")


def test_removes_a_member() -> None:
    result = remove_pointers(chat_document(), ["/request/user"])
    assert "user" not in result["request"]
    assert result["request"]["model"] == "demo"


def test_removes_a_whole_list() -> None:
    result = remove_pointers(chat_document(), ["/request/messages"])
    assert "messages" not in result["request"]
    assert result["request"]["user"] == "alice@contoso.com"


def test_removes_an_array_item_by_index() -> None:
    result = remove_pointers(chat_document(), ["/request/messages/1"])
    assert [message["role"] for message in result["request"]["messages"]] == ["system", "assistant"]


def test_indices_refer_to_the_original_document() -> None:
    result = remove_pointers(chat_document(), ["/request/messages/0", "/request/messages/1"])
    assert [message["role"] for message in result["request"]["messages"]] == ["assistant"]


def test_removes_a_member_inside_an_array_item() -> None:
    result = remove_pointers(chat_document(), ["/request/messages/1/content"])
    assert result["request"]["messages"][1] == {"role": "user", "name": "alice"}
    assert result["request"]["messages"][0]["content"] == "Be brief."


def test_wildcard_matches_every_array_item() -> None:
    result = remove_pointers(chat_document(), ["/request/messages/*/name"])
    assert [sorted(message) for message in result["request"]["messages"]] == [["content", "role"]] * 3


def test_wildcard_matches_every_object_member() -> None:
    result = remove_pointers(chat_document(), ["/metadata/*"])
    assert result["metadata"] == {}


def test_wildcard_as_last_token_empties_the_array() -> None:
    result = remove_pointers(chat_document(), ["/request/messages/*"])
    assert result["request"]["messages"] == []


@pytest.mark.parametrize(("pointer", "removed"), [("/a~1b", "a/b"), ("/m~0n", "m~n"), ("/", "")])
def test_escaped_and_empty_member_names(pointer: str, removed: str) -> None:
    result = remove_pointers(chat_document(), [pointer])
    assert removed not in result
    assert len(result) == len(chat_document()) - 1


@pytest.mark.parametrize(
    "pointer",
    [
        "/nope",
        "/request/nope/deeper",
        "/request/messages/3",
        "/request/messages/-",
        "/request/messages/01",  # a leading zero is not an array index (RFC 6901)
        "/request/messages/x",
        "/tenant/0",  # through a string
        "/request/model/name",
        "/nope/*",
    ],
)
def test_a_pointer_to_a_missing_path_removes_nothing(pointer: str) -> None:
    assert remove_pointers(chat_document(), [pointer]) == chat_document()


def test_overlapping_pointers_remove_the_outer_value() -> None:
    for pointers in (["/request/messages/0/name", "/request/messages"], ["/request/messages", "/request/messages/0"]):
        assert "messages" not in remove_pointers(chat_document(), pointers)["request"]


def test_the_empty_pointer_removes_everything() -> None:
    assert remove_pointers(chat_document(), [""]) == {}


def test_no_pointers_gives_an_equal_copy() -> None:
    document = chat_document()
    result = remove_pointers(document, ())
    assert result == document
    assert result is not document
    assert result["request"]["messages"] is not document["request"]["messages"]


def test_the_input_document_is_not_mutated() -> None:
    document = chat_document()
    before = copy.deepcopy(document)
    result = remove_pointers(document, ["/request/messages/*/name", "/request/user", "/a~1b"])
    assert document == before
    result["request"]["messages"].append({"role": "user"})
    result["metadata"]["team"] = "changed"
    assert document == before


def test_tuples_are_arrays() -> None:
    assert remove_pointers({"a": ("x", "y", "z")}, ["/a/1"]) == {"a": ["x", "z"]}
