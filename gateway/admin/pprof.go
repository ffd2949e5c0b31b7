package admin

import (
	"net/http"
	"net/http/pprof"

	"github.com/labstack/echo/v4"
)

// pprofRoutes serves Go's profiler under /admin/debug/pprof/, behind the
// admin token like the rest of /admin: profiles reveal request contents in
// memory and must not be public.
func pprofRoutes(grp *echo.Group) {
	grp.GET("/debug/pprof/", echo.WrapHandler(http.HandlerFunc(pprof.Index)))
	grp.GET("/debug/pprof/cmdline", echo.WrapHandler(http.HandlerFunc(pprof.Cmdline)))
	grp.GET("/debug/pprof/profile", echo.WrapHandler(http.HandlerFunc(pprof.Profile)))
	grp.GET("/debug/pprof/symbol", echo.WrapHandler(http.HandlerFunc(pprof.Symbol)))
	grp.GET("/debug/pprof/trace", echo.WrapHandler(http.HandlerFunc(pprof.Trace)))
	grp.GET("/debug/pprof/:name", func(c echo.Context) error {
		pprof.Handler(c.Param("name")).ServeHTTP(c.Response(), c.Request())
		return nil
	})
}
