// Package rlgin adapts redis-rl's net/http middleware (rlhttp) to gin: the same rules, keys,
// answers and settlement, as a gin.HandlerFunc. It is a module of its own, so that users of
// the core package do not get gin.
//
//	mw, err := rlhttp.New(limiter, rules)
//	router := gin.New()
//	router.Use(rlgin.Middleware(mw))
//	router.GET("/api/things", func(c *gin.Context) {
//		d, _ := rlhttp.DecisionFrom(c.Request.Context())
//		c.JSON(200, gin.H{"remaining": d.Remaining})
//	})
package rlgin

import (
	"context"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/redis-rl/redis-rl/clients/go/rlhttp"
)

// Middleware runs m before gin's handlers: a denied request is answered (429, 413, 503, 401
// with the fields and the JSON body, or m's denial handler) and the chain aborted; an
// admitted one goes on with the decision in c.Request's context and the RateLimit fields on
// the response, and its charge is settled on the status gin sends (DeductWhen, ReportCost).
func Middleware(m *rlhttp.Middleware) gin.HandlerFunc {
	return func(c *gin.Context) {
		admitted := false
		m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			admitted = true
			c.Request = r
			c.Writer = &writer{ResponseWriter: c.Writer, ctx: r.Context()}
			c.Next()
			rlhttp.Settle(r.Context(), c.Writer.Status()) // a status set but not yet written
		})).ServeHTTP(c.Writer, c.Request)
		if !admitted {
			c.Abort()
		}
	}
}

// writer settles the charge when gin writes the status (its WriteHeader only records it).
type writer struct {
	gin.ResponseWriter
	ctx context.Context
}

func (w *writer) WriteHeaderNow() {
	rlhttp.Settle(w.ctx, w.Status())
	w.ResponseWriter.WriteHeaderNow()
}

func (w *writer) Write(b []byte) (int, error) {
	rlhttp.Settle(w.ctx, w.Status())
	return w.ResponseWriter.Write(b)
}

func (w *writer) WriteString(s string) (int, error) {
	rlhttp.Settle(w.ctx, w.Status())
	return w.ResponseWriter.WriteString(s)
}
