"""根路由：业务 API 不带前缀（路径与规范一致），运维端点、admin、OpenAPI 文档。"""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import TemplateView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from agents.http import McpView
from ops.admin_login import admin_login
from ops.views import HealthView, MetricsView, ReadyView
from search.playground import playground

admin.site.site_header = "ragservice 管理后台"
admin.site.site_title = "ragservice 管理后台"
admin.site.index_title = "概览"

urlpatterns = [
    path("", TemplateView.as_view(template_name="index.html"), name="index"),
    path("health", HealthView.as_view(), name="health"),
    path("ready", ReadyView.as_view(), name="ready"),
    path("metrics", MetricsView.as_view(), name="metrics"),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="swagger-ui"),
    # 先于 admin.site.urls：同一个登录页，失败次数过多时回 429（ops.admin_login）
    path("admin/login/", admin_login, name="admin-login"),
    path("admin/", admin.site.urls),
    path("playground/", playground, name="search-playground"),
    path("mcp", McpView.as_view(), name="mcp"),
    path("", include("knowledge.api.urls")),
    path("", include("documents.api.urls")),
    path("", include("search.api.urls")),
]

handler400 = "infra.errors.handler400"
handler403 = "infra.errors.handler403"
handler404 = "infra.errors.handler404"
handler500 = "infra.errors.handler500"
