"""Proto messages to the plain values the wire models read, and result models to messages.

A request message becomes the dict its HTTP JSON body would be, so the same pydantic models
check it and refuse the same values: only fields that are set appear (proto3 `optional` keeps an
explicit "" or 0 apart from an absent field), a Timestamp is an aware datetime, a Struct is its
JSON object with integral numbers as integers (as JSON reads "1"), a StringList is its list.
A result model becomes its message through its JSON form (`model_dump(mode="json")`), whose
field names are the message's: null is absent, and a field the model gains and the message lacks
is an error, not a silent loss.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, TypeVar

from google.protobuf import struct_pb2
from google.protobuf.message import Message
from pydantic import BaseModel

from engram.domain.errors import ValidationFailed

M = TypeVar("M", bound=Message)
_MAX_EXACT = 2 ** 53  # past this a double holds no exact integer: leave it a float
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def request_dict(message: Message) -> dict[str, Any]:
    """The fields set on `message`, by name, as plain values (see the module's docstring)."""
    return {field.name: _value(field, value) for field, value in message.ListFields()}


def reply(message_type: type[M], model: BaseModel) -> M:
    """`model` as a `message_type`: what json_format.ParseDict of its JSON form gives, in a
    tenth of the time (ParseDict took 1.7 ms for a search's ten hits, more than the search's
    own JSON). Raises KeyError if the model holds a field the message lacks (a gateway bug: the
    proto must follow the model)."""
    message = message_type()
    _fill(message, model.model_dump(mode="json"))
    return message


def _fill(message: Message, data: dict[str, Any]) -> None:
    fields = message.DESCRIPTOR.fields_by_name
    for name, value in data.items():
        if value is None:  # JSON's null: the field stays absent
            continue
        field = fields[name]
        if field.message_type is None:
            if field.is_repeated:
                getattr(message, name).extend(value)
            else:
                setattr(message, name, value)
        elif field.is_repeated:
            target = getattr(message, name)
            for item in value:
                _set(target.add(), item)
        else:
            _set(getattr(message, name), value)


def _set(target: Message, value: Any) -> None:
    kind = target.DESCRIPTOR.full_name
    if kind == "google.protobuf.Struct":
        target.SetInParent()  # present even when empty: {} is not null
        target.update(value)
    elif kind == "google.protobuf.Timestamp":  # fromisoformat: FromJsonString's strptime took half the time
        since = datetime.fromisoformat(value) - _EPOCH
        target.seconds, target.nanos = since.days * 86_400 + since.seconds, since.microseconds * 1_000
    else:
        target.SetInParent()
        _fill(target, value)


def _value(field, value) -> Any:
    if field.message_type is None:
        return list(value) if field.is_repeated else value
    if field.is_repeated:
        return [_message(field.name, item) for item in value]
    return _message(field.name, value)


def _message(name: str, message: Message) -> Any:
    kind = message.DESCRIPTOR.full_name
    if kind == "google.protobuf.Struct":
        return {key: _json(value) for key, value in message.fields.items()}
    if kind == "google.protobuf.Timestamp":
        try:
            return message.ToDatetime(tzinfo=timezone.utc)
        except (ValueError, OverflowError):
            raise ValidationFailed(f"{name}: {message.seconds} s is outside the years 1 to 9999") from None
    if kind == "engram.memory.v1.StringList":
        return list(message.items)
    return request_dict(message)


def _json(value: struct_pb2.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "struct_value":
        return {key: _json(item) for key, item in value.struct_value.fields.items()}
    if kind == "list_value":
        return [_json(item) for item in value.list_value.values]
    if kind == "number_value":
        number = value.number_value
        return int(number) if number.is_integer() and abs(number) <= _MAX_EXACT else number
    if kind in ("string_value", "bool_value"):
        return getattr(value, kind)
    return None  # null_value, or no kind set
