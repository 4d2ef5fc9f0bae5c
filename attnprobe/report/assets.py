"""Inlined CSS and the vanilla-JS attention view (no CDN, no external requests).

The script reads the maps from ``<script type="application/json" id="ap-maps">``, decodes each
map's base64 uint8 weights (``weight = byte / 255``), and draws the chosen sentence / layer /
head as two token columns joined by lines whose opacity is the weight. Hovering a query token
(left) shows its row; hovering a key token (right) shows its column. Tokens are set with
``textContent``, never parsed as HTML. Neither string may contain ``</script`` or ``</style``.
"""

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5em auto;max-width:72em;
 padding:0 1em;color:#222}
h1{font-size:1.6em}h2{font-size:1.25em;border-bottom:1px solid #ddd;padding-bottom:.2em;
 margin-top:1.6em}
table.ap-table{border-collapse:collapse;font-size:.85em;margin:.5em 0}
table.ap-table th,table.ap-table td{border:1px solid #ddd;padding:.2em .5em;text-align:right}
table.ap-table th{background:#f4f4f4}
dl.card{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}
dl.card dt{font-weight:600}dl.card dd{margin:0}
.inputs li{font-family:ui-monospace,monospace;font-size:.85em;white-space:pre-wrap;
 word-break:break-all}
.head-cell rect:hover{stroke:#000;stroke-width:2}
.figure{overflow-x:auto}
#ap-view .controls{margin:.5em 0}#ap-view .controls label{margin-right:1em}
#ap-view .cols{display:flex;align-items:flex-start}
#ap-view .tok{font-family:ui-monospace,monospace;font-size:12px;height:16px;line-height:16px;
 padding:0 4px;white-space:pre;cursor:default;border-radius:2px}
#ap-view .left .tok{text-align:right}
#ap-view svg.lines{flex:none}
"""

JS = r"""
(function(){
  "use strict";
  var el=document.getElementById("ap-maps");if(!el)return;
  var maps=JSON.parse(el.textContent), cache={};
  var root=document.getElementById("ap-view"), ROW=16, W=220;
  function bytes(i){
    if(!cache[i]){var s=atob(maps[i].data),a=new Uint8Array(s.length);
      for(var j=0;j<s.length;j++)a[j]=s.charCodeAt(j);cache[i]=a;}
    return cache[i];
  }
  function opt(sel,items){sel.textContent="";items.forEach(function(it){
    var o=document.createElement("option");o.value=it[0];o.textContent=it[1];sel.appendChild(o);});}
  var sSel=root.querySelector(".sel-sentence"),lSel=root.querySelector(".sel-layer"),
      hSel=root.querySelector(".sel-head"),left=root.querySelector(".left"),
      right=root.querySelector(".right"),svg=root.querySelector("svg.lines");
  opt(sSel,maps.map(function(m,i){return [i,m.id];}));
  function fillAxes(){var m=maps[+sSel.value];
    opt(lSel,m.layers.map(function(l,i){return [i,"layer "+l];}));
    opt(hSel,m.heads.map(function(h,i){return [i,"head "+h];}));}
  function weights(){var i=+sSel.value,m=maps[i],Q=m.shape[2],K=m.shape[3];
    var off=((+lSel.value)*m.shape[1]+(+hSel.value))*Q*K;
    return {a:bytes(i),off:off,Q:Q,K:K,m:m};}
  function col(parent,toks,side){parent.textContent="";toks.forEach(function(t,i){
    var d=document.createElement("div");d.className="tok";d.textContent=t;d.dataset.i=i;
    d.addEventListener("mouseenter",function(){draw(side,i);});
    d.addEventListener("mouseleave",function(){draw(null,-1);});
    parent.appendChild(d);});}
  function draw(side,idx){var w=weights(),ns=svg.namespaceURI;
    svg.textContent="";svg.setAttribute("height",Math.max(w.Q,w.K)*ROW);
    var lt=left.children,rt=right.children,q,k,v;
    for(q=0;q<lt.length;q++)lt[q].style.background="";
    for(k=0;k<rt.length;k++)rt[k].style.background="";
    for(q=0;q<w.Q;q++){if(side==="q"&&q!==idx)continue;
      for(k=0;k<w.K;k++){if(side==="k"&&k!==idx)continue;
        v=w.a[w.off+q*w.K+k]/255;
        if(side==="q")rt[k].style.background="rgba(230,85,13,"+v+")";
        if(side==="k")lt[q].style.background="rgba(230,85,13,"+v+")";
        if(v<0.01)continue;
        var ln=document.createElementNS(ns,"line");
        ln.setAttribute("x1",0);ln.setAttribute("y1",q*ROW+ROW/2);
        ln.setAttribute("x2",W);ln.setAttribute("y2",k*ROW+ROW/2);
        ln.setAttribute("stroke","#e6550d");ln.setAttribute("stroke-width",2);
        ln.setAttribute("stroke-opacity",side?v:v*0.6);
        var t=document.createElementNS(ns,"title");
        t.textContent=w.m.query_tokens[q]+" \u2192 "+w.m.key_tokens[k]+": "+v.toFixed(3);
        ln.appendChild(t);svg.appendChild(ln);}}
    if(side==="q")lt[idx].style.background="#ddd";
    if(side==="k")rt[idx].style.background="#ddd";}
  function render(){var m=maps[+sSel.value];col(left,m.query_tokens,"q");
    col(right,m.key_tokens,"k");svg.setAttribute("width",W);draw(null,-1);}
  sSel.addEventListener("change",function(){fillAxes();render();});
  lSel.addEventListener("change",render);hSel.addEventListener("change",render);
  fillAxes();render();
})();
"""
