/* The attention view of an attnprobe report (inlined into the page; no network).
   Reads the maps from the JSON element #ap-maps, decodes each map's
   base64 uint8 weights (weight = byte / 255) and draws the chosen sentence / layer / head as
   two token columns joined by lines whose opacity is the weight. Hovering a query token (left)
   shows its row; hovering a key token (right) shows its column. Tokens at or after a map's
   prompt_length were generated: they are set in italics with a dotted underline (and a
   tooltip), and the sentence menu says how many. Text is set with textContent,
   never parsed as HTML, and bidirectional control characters are shown as U+202E the way
   attnprobe/report/text.py shows them in the rest of the page. */
(function(){
  "use strict";
  var el=document.getElementById("ap-maps");if(!el)return;
  var maps=JSON.parse(el.textContent), cache={};
  var root=document.getElementById("ap-view"), ROW=16, W=220;
  var BIDI=/[\u202A-\u202E\u2066-\u2069]/g;
  function show(t){return String(t).replace(BIDI,function(c){
    return "\u27E8U+"+c.charCodeAt(0).toString(16).toUpperCase()+"\u27E9";});}
  function bytes(i){
    if(!cache[i]){var s=atob(maps[i].data),a=new Uint8Array(s.length);
      for(var j=0;j<s.length;j++)a[j]=s.charCodeAt(j);cache[i]=a;}
    return cache[i];
  }
  function opt(sel,items){sel.textContent="";items.forEach(function(it){
    var o=document.createElement("option");o.value=it[0];o.textContent=show(it[1]);sel.appendChild(o);});}
  var sSel=root.querySelector(".sel-sentence"),lSel=root.querySelector(".sel-layer"),
      hSel=root.querySelector(".sel-head"),left=root.querySelector(".left"),
      right=root.querySelector(".right"),svg=root.querySelector("svg.lines");
  function generated(m){return m.prompt_length===null||m.prompt_length===undefined?0:
    m.query_tokens.length-m.prompt_length;}
  function isGen(m,i){return generated(m)>0&&i>=m.prompt_length;}
  opt(sSel,maps.map(function(m,i){var g=generated(m);
    return [i,g?m.id+" (+"+g+" generated)":m.id];}));
  if(maps.some(function(m){return generated(m)>0;}))
    root.querySelector(".gen-note").hidden=false;
  function fillAxes(){var m=maps[+sSel.value];
    opt(lSel,m.layers.map(function(l,i){return [i,"layer "+l];}));
    opt(hSel,m.heads.map(function(h,i){return [i,"head "+h];}));}
  function weights(){var i=+sSel.value,m=maps[i],Q=m.shape[2],K=m.shape[3];
    var off=((+lSel.value)*m.shape[1]+(+hSel.value))*Q*K;
    return {a:bytes(i),off:off,Q:Q,K:K,m:m};}
  function col(parent,toks,side,m){parent.textContent="";toks.forEach(function(t,i){
    var d=document.createElement("div");d.className="tok";d.textContent=show(t);d.dataset.i=i;
    if(isGen(m,i)&&(side==="q"||m.kind==="self")){d.classList.add("gen");d.style.fontStyle="italic";
      d.style.textDecoration="underline dotted";d.title="generated";}
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
        t.textContent=show(w.m.query_tokens[q])+" \u2192 "+show(w.m.key_tokens[k])+": "+
          v.toFixed(3);
        ln.appendChild(t);svg.appendChild(ln);}}
    if(side==="q")lt[idx].style.background="#ddd";
    if(side==="k")rt[idx].style.background="#ddd";}
  function render(){var m=maps[+sSel.value];col(left,m.query_tokens,"q",m);
    col(right,m.key_tokens,"k",m);svg.setAttribute("width",W);draw(null,-1);}
  sSel.addEventListener("change",function(){fillAxes();render();});
  lSel.addEventListener("change",render);hSel.addEventListener("change",render);
  fillAxes();render();
})();
