package gateway

import "github.com/labstack/echo/v4"

// adminPageRoutes registers the operator's HTML page. e is the root (for
// the login form, which needs no token); admin is the token-guarded group.
func (g *Gateway) adminPageRoutes(e *echo.Echo, admin *echo.Group) {}
