from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ClientFrame(_message.Message):
    __slots__ = ("request_id", "create", "subscribe", "unsubscribe", "publish", "commit", "refresh", "join")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    REFRESH_FIELD_NUMBER: _ClassVar[int]
    JOIN_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    create: CreateChannel
    subscribe: Subscribe
    unsubscribe: Unsubscribe
    publish: Publish
    commit: Commit
    refresh: Refresh
    join: JoinRequest
    def __init__(self, request_id: _Optional[int] = ..., create: _Optional[_Union[CreateChannel, _Mapping]] = ..., subscribe: _Optional[_Union[Subscribe, _Mapping]] = ..., unsubscribe: _Optional[_Union[Unsubscribe, _Mapping]] = ..., publish: _Optional[_Union[Publish, _Mapping]] = ..., commit: _Optional[_Union[Commit, _Mapping]] = ..., refresh: _Optional[_Union[Refresh, _Mapping]] = ..., join: _Optional[_Union[JoinRequest, _Mapping]] = ...) -> None: ...

class CreateChannel(_message.Message):
    __slots__ = ("channel", "group_info")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    GROUP_INFO_FIELD_NUMBER: _ClassVar[int]
    channel: str
    group_info: bytes
    def __init__(self, channel: _Optional[str] = ..., group_info: _Optional[bytes] = ...) -> None: ...

class Subscribe(_message.Message):
    __slots__ = ("channel", "after_seq", "subscription")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    channel: str
    after_seq: int
    subscription: int
    def __init__(self, channel: _Optional[str] = ..., after_seq: _Optional[int] = ..., subscription: _Optional[int] = ...) -> None: ...

class Unsubscribe(_message.Message):
    __slots__ = ("channel",)
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    channel: str
    def __init__(self, channel: _Optional[str] = ...) -> None: ...

class Publish(_message.Message):
    __slots__ = ("channel", "message", "message_id")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    channel: str
    message: _containers.RepeatedScalarFieldContainer[bytes]
    message_id: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, channel: _Optional[str] = ..., message: _Optional[_Iterable[bytes]] = ..., message_id: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Commit(_message.Message):
    __slots__ = ("channel", "epoch", "commit", "welcome")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    channel: str
    epoch: int
    commit: bytes
    welcome: bytes
    def __init__(self, channel: _Optional[str] = ..., epoch: _Optional[int] = ..., commit: _Optional[bytes] = ..., welcome: _Optional[bytes] = ...) -> None: ...

class Refresh(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: str
    def __init__(self, token: _Optional[str] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("channel", "join_id")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    JOIN_ID_FIELD_NUMBER: _ClassVar[int]
    channel: str
    join_id: str
    def __init__(self, channel: _Optional[str] = ..., join_id: _Optional[str] = ...) -> None: ...

class ServerFrame(_message.Message):
    __slots__ = ("reply", "deliveries", "welcome", "lagged")
    REPLY_FIELD_NUMBER: _ClassVar[int]
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    LAGGED_FIELD_NUMBER: _ClassVar[int]
    reply: Reply
    deliveries: Deliveries
    welcome: Welcome
    lagged: Lagged
    def __init__(self, reply: _Optional[_Union[Reply, _Mapping]] = ..., deliveries: _Optional[_Union[Deliveries, _Mapping]] = ..., welcome: _Optional[_Union[Welcome, _Mapping]] = ..., lagged: _Optional[_Union[Lagged, _Mapping]] = ...) -> None: ...

class Reply(_message.Message):
    __slots__ = ("request_id", "code", "message", "seq", "epoch", "head_seq", "cipher_suite")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEAD_SEQ_FIELD_NUMBER: _ClassVar[int]
    CIPHER_SUITE_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    code: int
    message: str
    seq: int
    epoch: int
    head_seq: int
    cipher_suite: int
    def __init__(self, request_id: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., seq: _Optional[int] = ..., epoch: _Optional[int] = ..., head_seq: _Optional[int] = ..., cipher_suite: _Optional[int] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("channel", "seq", "message", "sender", "handshake", "epoch", "subscription")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    HANDSHAKE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    channel: str
    seq: int
    message: bytes
    sender: bytes
    handshake: bool
    epoch: int
    subscription: int
    def __init__(self, channel: _Optional[str] = ..., seq: _Optional[int] = ..., message: _Optional[bytes] = ..., sender: _Optional[bytes] = ..., handshake: _Optional[bool] = ..., epoch: _Optional[int] = ..., subscription: _Optional[int] = ...) -> None: ...

class Deliveries(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Delivery]
    def __init__(self, items: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("channel", "welcome", "seq", "epoch")
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    channel: str
    welcome: bytes
    seq: int
    epoch: int
    def __init__(self, channel: _Optional[str] = ..., welcome: _Optional[bytes] = ..., seq: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class Lagged(_message.Message):
    __slots__ = ("channel",)
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    channel: str
    def __init__(self, channel: _Optional[str] = ...) -> None: ...
