"""API 层与管理后台共用的小部件：严格的输入序列化器、分页参数、错误响应的 OpenAPI 描述。"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from typing import IO, Any, ClassVar

from django.conf import settings
from django.http import QueryDict
from drf_spectacular.utils import OpenApiResponse, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import ErrorDetail as DrfErrorDetail
from rest_framework.parsers import JSONParser

from infra.errors import ApplicationError, ErrorCode, ErrorDetail

# multipart 的边界与文件以外的表单字段所占的余量：上传请求体的上限是 RAG_MAX_DOCUMENT_SIZE 加上它
MULTIPART_SLACK = 1 << 20

# JSON 嵌套层数上限：真实请求（过滤条件、元数据、分块参数）不超过三四层；不设上限时
# 十万个 "[" 会在解析或之后任何递归处理里触发 RecursionError
MAX_JSON_DEPTH = 32


class JsonTooDeepError(ValueError):
    """JSON 嵌套超过 MAX_JSON_DEPTH 层。"""


def json_depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """非递归地检查嵌套层数（标量 0 层，``[]`` 与 ``{}`` 1 层）。"""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, Mapping) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def json_has_nul(value: Any) -> bool:
    """任何一层的字符串值或对象键里有 NUL（``\\u0000``）：PostgreSQL 的 jsonb 与 text 都存不了它，
    必须在入口就拒绝，否则会在写库时变成 500（元数据是自由结构，字段级校验管不到嵌套的键）。"""
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return True
        elif isinstance(node, Mapping):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def json_has_nul_error(field: str | None) -> ApplicationError:
    return ApplicationError(
        ErrorCode.VALIDATION_ERROR, "Request validation failed", 400,
        [ErrorDetail(field, "NUL_CHARACTER", "JSON strings and keys must not contain NUL (\\u0000)")],
    )


def json_loads_bounded(text: str | bytes) -> Any:
    """``json.loads`` 加嵌套层数上限。C 解码器在约 1000 层时抛 RecursionError（便宜且干净），
    这里把它与超过 MAX_JSON_DEPTH 的结果一并换成 :class:`JsonTooDeepError`。"""
    try:
        value = json.loads(text)
    except RecursionError as exc:
        raise JsonTooDeepError from exc
    if json_depth_exceeds(value):
        raise JsonTooDeepError
    return value


def json_too_deep(field: str | None) -> ApplicationError:
    return ApplicationError(
        ErrorCode.VALIDATION_ERROR, "Request validation failed", 400,
        [ErrorDetail(field, "NESTING_TOO_DEEP", f"JSON nesting must not exceed {MAX_JSON_DEPTH} levels")],
    )


class BoundedJSONParser(JSONParser):
    """DRF 的 JSON 解析器加嵌套层数上限；请求体大小由 Django 的 DATA_UPLOAD_MAX_MEMORY_SIZE 限制
    （超限抛 RequestDataTooBig，统一渲染为 413）。"""

    def parse(self, stream: IO[Any], media_type: str | None = None,
              parser_context: Mapping[str, Any] | None = None) -> Any:
        try:
            value = super().parse(stream, media_type, parser_context)
        except RecursionError as exc:
            raise json_too_deep(None) from exc
        if json_depth_exceeds(value):
            raise json_too_deep(None)
        if json_has_nul(value):
            raise json_has_nul_error(None)
        return value


def _json_type_name(value: Any) -> str:
    """值在 JSON 里的类型名（错误信息用）。"""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, Mapping) else type(value).__name__


class OneOrManyField(serializers.ListField):
    """接受单个值或数组，单个值当作只有一项的数组；schema 里写成 ``anyOf: [单个值, 数组]``（见 infra.schema）。"""

    def to_internal_value(self, data: Any) -> Any:
        # 对象不包装：交给 ListField 报 not_a_list
        return super().to_internal_value(data if isinstance(data, list | Mapping) else [data])  # type: ignore[arg-type]


# JSON 输入里各类字段接受的值类型，按顺序匹配：BooleanField 先于 IntegerField（bool 是 int 的子类），
# MultipleChoiceField 先于 ChoiceField（它的值是数组，None 表示交给字段自己校验）。
# 整数不收 5.0：OpenAPI 3.0（JSON Schema draft 4）里 5.0 不是 integer
_JSON_TYPES: tuple[tuple[tuple[type[serializers.Field], ...], tuple[type, ...] | None, str], ...] = (
    ((serializers.MultipleChoiceField,), None, ""),
    ((serializers.BooleanField,), (bool,), "boolean"),
    ((serializers.IntegerField,), (int,), "integer"),
    ((serializers.FloatField, serializers.DecimalField), (int, float), "number"),
    ((serializers.CharField, serializers.ChoiceField, serializers.UUIDField, serializers.DateTimeField,
      serializers.DateField, serializers.TimeField, serializers.DurationField), (str,), "string"),
)


# OpenAPI 的 format: uuid 是 RFC 4122 的标准写法（8-4-4-4-12 个十六进制数字）；uuid.UUID 还收无连字符、带花括号、
# urn:uuid: 前缀的写法，按 schema 生成的客户端与服务端对“合法 id”的理解会不一致
_CANONICAL_UUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")


def canonical_uuid(value: object) -> uuid.UUID | None:
    """标准写法的 UUID 字符串（或 UUID 对象）→ UUID；别的写法与非法值 → None。"""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str) and _CANONICAL_UUID.fullmatch(value):
        return uuid.UUID(value)
    return None


def json_type_error(field: serializers.Field, value: Any) -> Any:
    """``value``（JSON 解析的结果）的类型不是 ``field`` 要的类型时，返回 DRF 形式的错误，否则 None。

    DRF 的字段会“好心”转换：CharField 收数字（123 → "123"），FloatField 收字符串（"0.5"），
    BooleanField 收 0/1 与 "true"，UUIDField 收整数。OpenAPI schema 写的是 JSON 类型，服务端必须一样严格，
    否则按 schema 生成的客户端与服务端对“合法请求”的理解不一致。数组与对象逐个检查元素
    （错误按下标/键给出，与 DRF 自己的嵌套错误同形）；嵌套的序列化器（StrictSerializer）自己检查。
    """
    if value is None or field.read_only or isinstance(field, serializers.BaseSerializer):
        return None  # null 由字段的 allow_null 判定
    if isinstance(field, serializers.ListField):
        if isinstance(field, OneOrManyField) and not isinstance(value, list):
            return json_type_error(field.child, value)
        if not isinstance(value, list):
            return None  # 不是数组：字段自己报 not_a_list
        errors = {index: error for index, item in enumerate(value)
                  if (error := json_type_error(field.child, item)) is not None}
        return errors or None
    if isinstance(field, serializers.DictField):
        if not isinstance(value, Mapping):
            return None
        errors = {key: error for key, item in value.items()
                  if (error := json_type_error(field.child, item)) is not None}
        return errors or None
    for classes, accepted, expected in _JSON_TYPES:
        if not isinstance(field, classes):
            continue
        if accepted is None or (isinstance(field, serializers.ChoiceField)
                                and not all(isinstance(choice, str) for choice in field.choices)):
            return None
        if not isinstance(value, accepted) or (bool not in accepted and isinstance(value, bool)):
            return [DrfErrorDetail(f"Expected a JSON {expected}, got {_json_type_name(value)}.", code="invalid_type")]
        if isinstance(field, serializers.UUIDField) and canonical_uuid(value) is None:
            return [DrfErrorDetail("Must be a UUID in the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.", code="invalid")]
        return None
    return None


def raw_length_error(field: serializers.Field, value: Any) -> Any:
    """去首尾空白的字符串字段：长度按收到的原文量。DRF 先去空白再量长度，schema 的 ``maxLength`` 说的却是请求里的
    字符串——前后带空白、去掉后恰好不超长的值，schema 判为非法，服务端曾经照收（schemathesis 找到的不一致）。
    字符串列表（条目的 ``tags``）逐个元素同样量，错误按 DRF 列表字段的写法以下标为键。"""
    if isinstance(field, serializers.ListField) and isinstance(value, list):
        errors = {index: error for index, item in enumerate(value)
                  if (error := raw_length_error(field.child, item)) is not None}
        return errors or None
    if (isinstance(field, serializers.CharField) and field.trim_whitespace and field.max_length is not None
            and isinstance(value, str) and len(value) > field.max_length):
        return [DrfErrorDetail(field.error_messages["max_length"].format(max_length=field.max_length),
                               code="max_length")]
    return None


def reject_repeated(data: QueryDict) -> None:
    """同一个查询参数或表单字段给了多次（``?page_size=-1&page_size=3``、两个 file）时报 400，逐个点名。

    schema 里每个都是单值；DRF 会默默取最后一个，于是 schema 判为非法的请求服务端照收（schemathesis 找到的不一致）。
    """
    repeated = sorted(name for name, values in data.lists() if len(values) > 1)
    if repeated:
        raise serializers.ValidationError(
            {name: ["Given more than once; each parameter takes one value."] for name in repeated})


def query_values(data: QueryDict) -> dict[str, str]:
    """查询参数 → 每个名字一个值的 dict，交给列表接口的查询序列化器。

    不直接传 QueryDict：DRF 对 QueryDict 用 HTML 表单的规则，非必填字段的空串当作没传（``status=`` 会被接受），
    而 schema 的 pattern 不接受空串。
    """
    reject_repeated(data)
    return {name: str(value) for name, value in data.items()}


class StrictSerializer(serializers.Serializer):
    """拒绝未知字段与类型不符的值：拼错的字段名、给字符串字段传数字、给数字字段传字符串都得到 400，
    而不是被静默忽略或转换。"""

    # 这段说明会出现在 OpenAPI 的请求体描述里，实现细节写在这里：输入来自 JSON（请求体、MCP 工具参数）时
    # 值的 JSON 类型必须与字段一致（见 json_type_error，错误码 INVALID_TYPE）。查询参数与 multipart 表单的值
    # 天生都是字符串：查询参数的序列化器把 json_input 设为 False，传入 QueryDict（表单）时也不检查
    json_input: ClassVar[bool] = True

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        if isinstance(data, QueryDict):  # multipart 表单
            reject_repeated(data)
        type_errors: dict[str, Any] = {}
        if isinstance(data, Mapping):
            type_errors = {name: error for name, field in self.fields.items()
                           if name in data and (error := raw_length_error(field, data[name])) is not None}
        if self.json_input and isinstance(data, Mapping) and not isinstance(data, QueryDict):
            type_errors.update({name: error for name, field in self.fields.items()
                                if name in data and (error := json_type_error(field, data[name])) is not None})
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            # 其余字段的错误照常报出；类型错的字段以类型错误为准（DRF 的转换可能恰好成功，也可能报别的）
            if type_errors and isinstance(exc.detail, dict):
                raise serializers.ValidationError({**exc.detail, **type_errors}) from exc
            raise
        if type_errors:
            raise serializers.ValidationError(type_errors)
        return value


class VerbatimTextField(serializers.CharField):
    """原样保存的正文（不去掉首尾空白，缩进与空行都有意义），但不能全是空白：那样没有任何可索引的文本。
    schema 里与其他不许为空白的字段用同一个 pattern（见 infra.schema）。"""

    rejects_blank_text = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(trim_whitespace=False, **kwargs)

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        if not value.strip():
            self.fail("blank")
        return value


class SettingBoundedIntegerField(serializers.IntegerField):
    """上限取自某个 settings 项的整数字段（如 RAG_MAX_PAGE_SIZE）。

    DRF 每次实例化序列化器都会用原参数重新构造字段，所以上限在那一刻读取：改了设置（包括测试里的
    ``settings`` 夹具）既影响校验，也影响 OpenAPI schema 里的 ``maximum``，两者不会不一致。
    """

    def __init__(self, *, setting: str, **kwargs: Any) -> None:
        super().__init__(max_value=getattr(settings, setting), **kwargs)


class SettingBoundedListField(serializers.ListField):
    """最多项数取自某个 settings 项的数组字段（如 RAG_ITEM_BULK_MAX），schema 里是 ``maxItems``；读取时机同上。"""

    def __init__(self, *, setting: str, **kwargs: Any) -> None:
        super().__init__(max_length=getattr(settings, setting), **kwargs)


# page 的上限：OFFSET = (page-1)*page_size 必须远小于 bigint，且没有人真的翻到第一百万页
MAX_PAGE = 1_000_000


class PageQuerySerializer(StrictSerializer):
    """page 从 1 开始，上限 MAX_PAGE；page_size 上限由 RAG_MAX_PAGE_SIZE 决定。

    列表接口的查询参数（值都是字符串，"2" 就是 2），子类也一样。
    """

    json_input = False

    page = serializers.IntegerField(min_value=1, max_value=MAX_PAGE, default=1)
    page_size = SettingBoundedIntegerField(setting="MAX_PAGE_SIZE", min_value=1, default=20)


# str.isspace() 的全部字符（Python re 的 \s、str.strip() 用的就是这一组），写成显式的字符类：不同正则引擎的
# \s 并不一样（ECMA 含 \ufeff，Rust 不含 \x1c-\x1f），schema 里的 pattern 必须在哪里都表示同一组字符
WHITESPACE_CLASS = r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


class StatusListField(serializers.CharField):
    """``status=a,b`` 形式的查询参数：逗号分隔，每项去掉首尾空白后必须是允许的状态。

    schema 里用同样规则的正则描述（见 :meth:`pattern`），生成的请求与服务端的判定一致。
    """

    def __init__(self, *, allowed: list[str], **kwargs: Any) -> None:
        self.allowed = list(allowed)
        super().__init__(**kwargs)

    @property
    def pattern(self) -> str:
        one = "(?:" + "|".join(re.escape(value) for value in self.allowed) + ")"
        space = f"[{WHITESPACE_CLASS}]*"
        return rf"^{space}{one}{space}(?:,{space}{one}{space})*$"

    def to_internal_value(self, data: Any) -> list[str]:  # type: ignore[override]
        value = super().to_internal_value(data)
        statuses = [part.strip() for part in value.split(",")]
        invalid = [s for s in statuses if s not in self.allowed]
        if invalid:
            raise serializers.ValidationError(
                f"Unknown status {', '.join(map(repr, invalid))}; expected one or more of: {', '.join(self.allowed)}."
            )
        return statuses


def page_response(serializer_class: type[serializers.Serializer], name: str) -> serializers.Serializer:
    """列表响应：``{items, total, page, page_size}``。"""
    return inline_serializer(
        name,
        {
            "items": serializer_class(many=True),
            "total": serializers.IntegerField(),
            "page": serializers.IntegerField(),
            "page_size": serializers.IntegerField(),
        },
    )


ERROR_SCHEMA = inline_serializer(
    "ErrorResponse",
    {
        "error": inline_serializer(
            "ErrorBody",
            {
                "code": serializers.CharField(),
                "message": serializers.CharField(),
                "request_id": serializers.UUIDField(),
                "details": inline_serializer(
                    "ErrorDetail",
                    {
                        "field": serializers.CharField(allow_null=True),
                        "code": serializers.CharField(),
                        "message": serializers.CharField(),
                    },
                    many=True,
                ),
            },
        )
    },
)


def error_responses(*statuses: int) -> dict[int, OpenApiResponse]:
    """为 extend_schema 生成一组统一错误格式的响应声明。

    总是包含：400/401；任何请求都可能碰到的 414（URL 过长）、431（请求头过大）与 429（限流）；数据库暂时不可达时的 503。
    """
    wanted = sorted({400, 401, 414, 429, 431, 503, *statuses})
    return {status: OpenApiResponse(ERROR_SCHEMA, description="统一错误格式") for status in wanted}
